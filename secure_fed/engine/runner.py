"""The round engine: one process simulates server and clients through a guarded channel.

Per round: sample clients → send each its payload (checked by the
:class:`~secure_fed.engine.guard.MessageGuard`) → run the client function on
(payload, its own data) → check the reply → aggregate θ and rows → server
optimiser → the algorithm's server step on W → evaluate / checkpoint.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from secure_fed.algorithms import SetupContext
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.config import dump_config
from secure_fed.config.schema import ExperimentConfig
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.builders import (
    build_algorithm,
    build_dataset,
    build_encoder_for,
    build_federation,
    resolve_device,
)
from secure_fed.engine.guard import MessageGuard
from secure_fed.engine.server_optimizers import ServerOptimizer
from secure_fed.errors import RoundAborted
from secure_fed.metrics import evaluate_scores
from secure_fed.models import mean_pairwise_cosine, spread_init

CHECKPOINT_VERSION = 3

#: Keys of a ``metrics.jsonl`` line besides the evaluation metrics: public facts, and values computed from
#: the released model only. Everything else a round reports (losses, participant counts, clipping statistics,
#: regulariser values, protocol timings) is a statistic of private data and goes to ``private/diagnostics.jsonl``.
PUBLIC_ROUND_KEYS = ("round", "W_mean_cos", "wall_seconds", "privacy")
PRIVATE_DIR = "private"


def _to_cpu(obj: Any) -> Any:
    """A copy of nested dicts/lists of tensors with every tensor on the CPU (portable checkpoints)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def client_seed(seed: int, round_idx: int, cid: int) -> int:
    return int(np.random.SeedSequence([seed, round_idx, cid]).generate_state(1)[0])


def sample_clients(
    sizes: np.ndarray, fraction: float, how: str, seed: int, round_idx: int, uniforms: np.ndarray | None = None
) -> np.ndarray:
    """Client ids for one round: ``ceil(fraction·N)`` without replacement (uniform or ∝ size), or Poisson
    (each client independently with probability ``fraction``).

    ``uniforms`` (one per client) replaces the public seed's draws for Poisson sampling: a DP layer passes draws
    from the server's secret, since amplification by sampling needs a sample the adversary cannot recompute."""
    n = len(sizes)
    rng = np.random.default_rng([seed, 7, round_idx])
    if how == "poisson":  # each client independently with probability `fraction` (what DP accounting assumes)
        if fraction >= 1.0:
            return np.arange(n)
        u = rng.random(n) if uniforms is None else np.asarray(uniforms)
        return np.flatnonzero(u < fraction)
    m = max(1, math.ceil(fraction * n))
    if m >= n:
        return np.arange(n)
    p = sizes / sizes.sum() if how == "proportional" else None
    return np.sort(rng.choice(n, size=m, replace=False, p=p))


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None


class Experiment:
    """A configured run. ``run()`` trains, evaluates, checkpoints and writes the run directory."""

    def __init__(self, cfg: ExperimentConfig, *, run_dir: str | Path, data_root: str | None = None, dataset: Any = None):
        """``dataset`` (a :class:`~secure_fed.data.MultiLabelDataset`) replaces the configured one (shadow runs)."""
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.device = resolve_device(cfg.device)
        self.dataset = dataset if dataset is not None else build_dataset(cfg, data_root)
        self.algorithm = build_algorithm(cfg, self.device)
        self.fed = build_federation(cfg, self.dataset, type(self.algorithm), self.device)
        # server model (θ) and a worker model for local training
        self.encoder = build_encoder_for(cfg, self.dataset).to(self.device)
        self.worker = build_encoder_for(cfg, self.dataset).to(self.device)
        self.theta = {n: p.detach().clone() for n, p in self.encoder.named_parameters()}
        gen = torch.Generator().manual_seed(cfg.seed * 104729 + 1)
        self.W = spread_init(self.dataset.num_labels, cfg.model.embedding_dim, generator=gen).to(self.device)
        # one optimiser for θ, one for W rows (used when server_optimizer.apply_to_rows is set)
        opt_args = cfg.training.server_optimizer.model_dump(exclude={"apply_to_rows"})
        self.server_opt = ServerOptimizer(**opt_args)
        self.row_opt = ServerOptimizer(**opt_args)
        self.messages: list[dict[str, Any]] | None = [] if cfg.output.log_messages else None
        self.guard = MessageGuard(
            theta_shapes={n: tuple(t.shape) for n, t in self.theta.items()},
            embedding_dim=cfg.model.embedding_dim,
            allowed_rows={c.client_id: {int(i) for i in c.known_labels} for c in self.fed.clients},
            log=self.messages,
        )
        from protocols import ProtocolStack, StackEnv

        self.stack_env = StackEnv(
            num_clients=len(self.fed.clients),
            clients_per_row=self._clients_per_row(),
            num_labels=self.dataset.num_labels,
            embedding_dim=cfg.model.embedding_dim,
            theta=self.theta,
            device=self.device,
            seed=cfg.seed,
            max_clients_per_instance=self._max_clients_per_instance(),
        )
        self.stack = ProtocolStack(cfg, self.stack_env)
        self.stack.wrap_algorithm(self.algorithm)
        self.label_perm: np.ndarray | None = None  # simulator's view: label l lives in row label_perm[l]
        self.stop_reason: str | None = None
        self.trainer = LocalTrainer(self.worker)
        t = cfg.training
        self.local = LocalTraining(
            epochs=t.local_epochs,
            batch_size=t.batch_size,
            lr=t.client_lr,
            optimizer=t.client_optimizer,
            momentum=t.client_momentum,
            weight_decay=t.weight_decay,
            precision=t.precision,
        )
        self.round = 0
        self.history: list[dict[str, Any]] = []  #: released: one line of metrics.jsonl per round
        self.diagnostics: list[dict[str, Any]] = []  #: private: one line of private/diagnostics.jsonl per round
        self.setup_facts: dict[str, Any] | None = None
        self.wall_before = 0.0
        self._init_audit_hooks()

    def _init_audit_hooks(self) -> None:
        """The server tap (what the server sees, for ``threat_models``) and the auditor's canaries."""
        names = self.cfg.attacks.names()
        self.tap = self.canaries = None
        if not names:
            return
        from threat_models.canaries import DiracCanaries
        from threat_models.views import ServerTap

        first = next(iter(self.theta))
        self.tap = ServerTap(theta0=self.theta, parameter=first)
        audit = self.cfg.attacks.one_run_audit
        if "one_run_audit" in names and audit.canaries > 0:
            client = self.cfg.privacy.client if "dp" in self.cfg.protocols else None
            norm = audit.canary_norm or (client.clip_norm if client is not None else 0.05)
            self.canaries = DiracCanaries(
                m=audit.canaries, norm=norm, num_clients=len(self.fed.clients),
                theta_shapes={n: tuple(t.shape) for n, t in self.theta.items()},
            )  # fmt: skip

    # ----------------------------------------------------------------- channel
    def _exchange(self, cid: int, payload: dict, client_fn) -> dict:
        client = self.fed.clients[cid]
        self.guard.check_down(cid, payload)
        reply = client_fn(payload, client)
        self.guard.check_up(cid, reply)
        return reply

    def _query_all(self, payload_fn, client_fn) -> list[tuple[int, dict]]:
        return [(c.client_id, self._exchange(c.client_id, payload_fn(c.client_id), client_fn)) for c in self.fed.clients]

    def _query_one(self, cid: int, payload: dict, client_fn) -> dict:
        return self._exchange(cid, payload, client_fn)

    def _training_exchange(self, cid: int, payload: dict, fn) -> dict:
        """Downlink checked; the client's plaintext reply checked on the client; the wire message logged."""
        client = self.fed.clients[cid]
        self.guard.check_down(cid, payload)
        wire = fn(payload, client)
        self.guard.record("up", cid, wire)
        if self.tap is not None:
            self.tap.on_uplink(self.round, cid, wire)
        return wire

    def permute_labels(self, perm) -> None:
        """Re-index labels: label l becomes row perm[l] (used by keyed label pseudonyms)."""
        perm = np.asarray(perm, dtype=np.int64)
        if sorted(perm.tolist()) != list(range(self.dataset.num_labels)):
            raise ValueError("a label permutation must be a bijection on the labels")
        self.label_perm = perm if self.label_perm is None else perm[self.label_perm]
        t = torch.as_tensor(perm)
        for c in self.fed.clients:
            c.known_labels = t[c.known_labels]
        y = np.zeros_like(self.fed.y_test)
        y[:, perm] = self.fed.y_test
        self.fed.y_test = y
        self.guard.allowed_rows = {c.client_id: {int(i) for i in c.known_labels} for c in self.fed.clients}
        self.stack_env.clients_per_row = self._clients_per_row()

    def _max_clients_per_instance(self) -> int:
        """The most clients that hold one training instance (simulator knowledge of the partition)."""
        shards = [s.indices for s in self.fed.shards]
        if not shards:
            return 1
        counts = np.bincount(np.concatenate(shards), minlength=self.dataset.train.num_instances)
        return max(1, int(counts.max()))

    def _clients_per_row(self) -> torch.Tensor:
        per_row = torch.zeros(self.dataset.num_labels, dtype=torch.long)
        for c in self.fed.clients:
            per_row[c.known_labels] += 1
        return per_row

    # ----------------------------------------------------------------- rounds
    def setup(self) -> None:
        if self.setup_facts is not None:
            return
        from protocols import ProtocolSetup

        facts = {}
        if self.stack:
            facts = self.stack.setup(
                ProtocolSetup(
                    query=self._query_all,
                    query_one=self._query_one,
                    clients=self.fed.clients,
                    label_names=list(self.dataset.label_names),
                    permute_labels=self.permute_labels,
                )
            )
        query = self.stack.wrap_query(self._query_all)
        ctx = SetupContext(
            query=query if self.tap is None else self.tap.wrap_setup_query(query),
            num_labels=self.dataset.num_labels,
            W=self.W,
            device=self.device,
        )
        self.setup_facts = {**self.algorithm.setup(ctx), **facts}

    def train_round(self) -> dict[str, Any]:
        """One round; a round a protocol aborts (:class:`RoundAborted`) changes nothing and is logged."""
        try:
            return self._train_round()
        except RoundAborted as e:
            self.round += 1
            return {"train_loss": float("nan"), "clients": 0, "aborted": str(e)}

    def _train_round(self) -> dict[str, Any]:
        cfg, algo = self.cfg, self.algorithm
        sizes = np.array([c.num_examples for c in self.fed.clients], dtype=float)
        secret = self.stack.cohort_uniforms(self.round, len(sizes))
        chosen = sample_clients(sizes, cfg.training.client_fraction, cfg.training.sampling, cfg.seed, self.round, secret)
        base = RoundSession(cohort=[int(c) for c in chosen], theta=self.theta, W=self.W, weighting=cfg.training.aggregation)
        session = self.stack.open_round(self.round, base)
        for cid in session.cohort:
            client = self.fed.clients[cid]
            payload = algo.downlink(self.theta, self.W, client.known_labels.to(self.W.device))
            gen = torch.Generator().manual_seed(client_seed(cfg.seed, self.round, int(cid)))

            def train(p, d, g=gen, cid=cid):
                reply = self.trainer.update(p, d, self.local, g)
                self.guard.check_up(cid, reply, record=False)  # the client's own update, before any protocol
                return reply

            if self.canaries is not None:
                train = self.canaries.client_mod(train)
            fn = session.client_mod(self.stack.client_mod(train))
            session.submit(cid, self._training_exchange(cid, payload, fn))
        agg = session.finish()
        if self.tap is not None:
            self.tap.on_aggregate(self.round, list(session.cohort), agg.theta_sum if agg.num_clients else None)
        if agg.num_clients > 0 or agg.theta_denominator is not None:
            self.server_opt.step(self.theta, agg.theta_mean())
            if algo.trains_rows:
                row_delta, seen = agg.rows_mean()
                if cfg.training.server_optimizer.apply_to_rows:
                    self.row_opt.step({"W": self.W}, {"W": row_delta}, masks={"W": seen})
                else:
                    self.W[seen] += row_delta[seen]
                self.W[seen] = F.normalize(self.W[seen], dim=-1)  # rows live on the unit sphere
        labels = [self.fed.clients[int(c)].known_labels for c in session.cohort]
        participating = torch.unique(torch.cat(labels)).to(self.W.device) if labels else torch.zeros(0, dtype=torch.long)
        stats = algo.server_step(self.W, self.round, participating)
        self.round += 1
        loss = agg.loss_sum / agg.num_clients if agg.num_clients else float("nan")
        return {"train_loss": loss, "clients": agg.num_clients, **stats, **self.stack.round_stats()}

    def privacy_now(self) -> dict[str, Any]:
        """ε and δ now: per DP unit, plus the primary unit's values at the top (ε = ∞ without DP)."""
        units = self.stack.privacy()
        if not units:
            return {"epsilon": "inf", "delta": None}
        primary = "instance" if "instance" in units else "client"
        out: dict[str, Any] = {"epsilon": units[primary]["epsilon"], "delta": units[primary]["delta"], "unit": primary}
        for name, u in units.items():
            out[name] = {"epsilon": u["epsilon"], "delta": u["delta"], "steps": u["steps"]}
        return out

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        for n, p in self.encoder.named_parameters():
            p.copy_(self.theta[n])
        self.encoder.eval()
        Wn = F.normalize(self.W, dim=-1)
        chunks = [F.normalize(self.encoder(xb), dim=-1) @ Wn.T for xb in torch.split(self.fed.x_test, 2048)]
        scores = torch.cat(chunks).float().cpu().numpy()
        ks = tuple(self.cfg.evaluation.ks)
        return evaluate_scores(scores, self.fed.y_test, ks=ks, threshold=self.cfg.evaluation.threshold)

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": CHECKPOINT_VERSION,
            "round": self.round,
            "theta": {n: t.cpu() for n, t in self.theta.items()},
            "W": self.W.cpu(),
            "server_opt": _to_cpu(self.server_opt.state_dict()),
            "row_opt": _to_cpu(self.row_opt.state_dict()),
            "algorithm": _to_cpu(self.algorithm.state_dict()),
            "protocols": self.stack.state_dict(),
            "setup_facts": self.setup_facts,
            "history": self.history,
            "diagnostics": self.diagnostics,
            "wall_seconds": self.wall_before,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.round = sd["round"]
        self.theta = {n: t.to(self.device) for n, t in sd["theta"].items()}
        self.W = sd["W"].to(self.device)
        self.server_opt.load_state_dict(sd["server_opt"], self.device)
        self.row_opt.load_state_dict(sd["row_opt"], self.device)
        if sd["setup_facts"] is not None:
            self.algorithm.load_state_dict(sd["algorithm"])
        self.setup_facts = sd["setup_facts"]
        self.stack.load_state_dict(sd.get("protocols", {}))
        self.history = sd["history"]
        self.diagnostics = sd.get("diagnostics", [])
        self.wall_before = sd["wall_seconds"]

    def client_state_dict(self) -> dict[str, Any]:
        """What the clients (and the simulator) keep on their own side: protocol secrets, the label re-indexing."""
        return {"protocols": self.stack.client_state_dict(), "label_perm": self.label_perm}

    def save_checkpoint(self, name: str = "last.pt") -> Path:
        ckpt_dir = self.run_dir / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        files = [
            (name, self.state_dict()),
            ("clients.pt", self.client_state_dict()),  # the clients' own storage
            ("server_secrets.pt", {"protocols": self.stack.secret_state_dict()}),  # the server's private keys (DP noise)
        ]
        if self.tap is not None:  # the server's recorded view, and the auditor's secrets, kept apart
            files.append(("server_view.pt", self.tap.state_dict()))
        if self.canaries is not None:
            files.append(("auditor.pt", {"canaries": self.canaries.state_dict()}))
        for fname, state in files:
            tmp = ckpt_dir / (fname + ".tmp")
            torch.save(state, tmp)
            tmp.replace(ckpt_dir / fname)
        return ckpt_dir / name

    def resume(self) -> bool:
        """Load ``checkpoints/last.pt`` if present; returns whether it did."""
        path = self.run_dir / "checkpoints" / "last.pt"
        if not path.is_file():
            return False
        clients = self.run_dir / "checkpoints" / "clients.pt"
        if clients.is_file():
            cs = torch.load(clients, map_location="cpu", weights_only=False)
            self.stack.load_client_state_dict(cs["protocols"])
            if cs["label_perm"] is not None:
                self.permute_labels(cs["label_perm"])
        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))
        secrets = self.run_dir / "checkpoints" / "server_secrets.pt"
        if secrets.is_file():
            self.stack.load_secret_state_dict(torch.load(secrets, map_location="cpu", weights_only=False)["protocols"])
        tap = self.run_dir / "checkpoints" / "server_view.pt"
        if self.tap is not None and tap.is_file():
            self.tap.load_state_dict(torch.load(tap, map_location="cpu", weights_only=False))
        auditor = self.run_dir / "checkpoints" / "auditor.pt"
        if self.canaries is not None and auditor.is_file():
            from threat_models.canaries import DiracCanaries

            self.canaries = DiracCanaries.from_state_dict(torch.load(auditor, map_location="cpu", weights_only=False)["canaries"])
        return True

    # -------------------------------------------------------------------- run
    def _write_metrics(self) -> None:
        """``metrics.jsonl`` (released) and ``private/diagnostics.jsonl`` (the operator's only)."""
        private = self.run_dir / PRIVATE_DIR
        private.mkdir(exist_ok=True)
        for path, recs in ((self.run_dir / "metrics.jsonl", self.history), (private / "diagnostics.jsonl", self.diagnostics)):
            with path.open("w") as fh:
                for rec in recs:
                    fh.write(json.dumps(rec) + "\n")

    def summary(self, wall: float, status: str) -> dict[str, Any]:
        last = next((h for h in reversed(self.history) if "P@1" in h), {})
        metric_keys = [k for k in last if k not in PUBLIC_ROUND_KEYS]
        return {
            "algorithm": self.cfg.algorithm.name,
            "dataset": self.dataset.name,
            "rounds_completed": self.round,
            "rounds_planned": self.cfg.training.rounds,
            "status": status,
            "final": {k: last[k] for k in metric_keys},
            "W_mean_cos": last.get("W_mean_cos"),
            "privacy": self.privacy_summary(),
            "protocols": list(self.cfg.protocols),
            "stop_reason": self.stop_reason,
            "wall_seconds": wall,
            "seconds_per_round": wall / max(self.round, 1),
            "device": str(self.device),
            "num_clients": len(self.fed.clients),
        }

    def privacy_summary(self) -> dict[str, Any]:
        units = self.stack.privacy()
        if not units:
            return {"epsilon": "inf", "delta": None, "note": "no differential privacy mechanism in this run"}
        now = self.privacy_now()
        out = {"epsilon": now["epsilon"], "delta": now["delta"], "unit": now["unit"], "units": units}
        warnings = sorted({u["warning"] for u in units.values() if "warning" in u})
        if warnings:
            out["warning"] = "; ".join(warnings)
        return out

    def private_summary(self) -> dict[str, Any]:
        """Statistics of private data for the operator (``private/summary.json``): never released."""
        return {
            "setup": self.setup_facts,
            "protocols": self.stack.private_report(),
            "last_round": self.diagnostics[-1] if self.diagnostics else None,
        }

    def run(self, *, progress: bool | None = None) -> RunResult:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        progress = cfg.output.progress if progress is None else progress
        t0 = time.perf_counter()
        self.setup()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.training.rounds, initial=self.round, desc=f"{cfg.algorithm.name}", unit="round", mininterval=1.0)
        status = "completed"
        try:
            while self.round < cfg.training.rounds:
                why = self.stack.budget_stop(self.round)
                if why is not None:
                    status, self.stop_reason = "budget_exhausted", why
                    break
                stats = self.train_round()
                self.diagnostics.append({"round": self.round, **stats})
                rec: dict[str, Any] = {"round": self.round}
                if self.round % cfg.evaluation.every == 0 or self.round == cfg.training.rounds:
                    rec.update(self.evaluate())
                    rec["W_mean_cos"] = mean_pairwise_cosine(self.W)
                rec["wall_seconds"] = self.wall_before + time.perf_counter() - t0
                rec["privacy"] = self.privacy_now()
                self.history.append(rec)
                self._write_metrics()
                if bar is not None:
                    post = {"loss": f"{stats['train_loss']:.4f}"}
                    last = self.history[-1] if self.history else {}
                    if "P@1" in last:
                        post["P@1"] = f"{last['P@1']:.2f}"
                        post["cos(W)"] = f"{last['W_mean_cos']:.3f}"
                    bar.set_postfix(post)
                    bar.update(1)
                if self.round % cfg.output.checkpoint_every == 0 and self.round < cfg.training.rounds:
                    self.wall_before += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    self.save_checkpoint()
        except KeyboardInterrupt:
            status = "interrupted"
        finally:
            if bar is not None:
                bar.close()
        if status == "budget_exhausted" and self.history and "P@1" not in self.history[-1]:
            self.history[-1].update(self.evaluate())  # the model as released at the stop
            self.history[-1]["W_mean_cos"] = mean_pairwise_cosine(self.W)
            self._write_metrics()
        self.wall_before += time.perf_counter() - t0
        self.save_checkpoint()
        if status in ("completed", "budget_exhausted"):
            self.save_checkpoint("final.pt")
        summary = self.summary(self.wall_before, status)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        (self.run_dir / PRIVATE_DIR).mkdir(exist_ok=True)
        (self.run_dir / PRIVATE_DIR / "summary.json").write_text(json.dumps(self.private_summary(), indent=2, default=str))
        return RunResult(self.run_dir, summary, self.history, self.messages)
