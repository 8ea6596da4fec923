"""The round engine: one process simulates server and clients through a guarded channel.

The server's model is a set of named tensors (θ, and W when the model family keeps a row table); the
algorithm declares what each client may see of them and which message keys it uses, and the
:class:`~secure_fed.engine.guard.MessageGuard` checks every message against those declarations.

Per round: the layers may stop the run (budget) → sample the cohort → each client's payload (the
algorithm's ``downlink``, checked) → the client function, wrapped by callbacks, layers and the round's
aggregation session, run by the executor → the session's aggregate (layers: unmask, decrypt, noise) →
server optimiser on θ, rows written back and projected by the family → the algorithm's server step →
callbacks (evaluation, privacy record, metrics files, attack taps, checkpoint, progress). The README's
architecture table shows the same order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from secure_fed.algorithms import SetupContext
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.config import dump_config
from secure_fed.config.schema import ExperimentConfig
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.allocator import keep_freed_memory
from secure_fed.engine.builders import (
    build_algorithm,
    build_dataset,
    build_federation,
    build_model,
    resolve_device,
    use_deterministic_cuda,
)
from secure_fed.engine.callbacks import (
    Callback,
    Checkpointing,
    ClientEvaluation,
    Evaluation,
    MetricsFiles,
    PrivacyRecord,
    ProgressBar,
    TensorBoardLog,
    build_callbacks,
)
from secure_fed.engine.checkpoints import CheckpointMixin
from secure_fed.engine.collector import long_lived_frozen
from secure_fed.engine.evaluation import EvaluationMixin
from secure_fed.engine.executors import EXECUTORS, Channel, ClientJob
from secure_fed.engine.guard import MessageGuard
from secure_fed.engine.layers import ProtocolSetup, ProtocolStack, StackEnv
from secure_fed.engine.reporting import PRIVATE_DIR, ReportMixin
from secure_fed.engine.sampling import client_seed, cohort_size, sample_clients
from secure_fed.engine.server_optimizers import ServerOptimizer
from secure_fed.errors import ConfigError, RoundAborted, SecureFedError
from secure_fed.io import check_writable_dir
from secure_fed.memory import check_memory, plan_memory
from secure_fed.messages import FullTable, Params, Rules
from secure_fed.models import mean_pairwise_cosine
from secure_fed.models.families import model_family
from secure_fed.models.sparse_rows import SparseRows, column_major
from secure_fed.run_status import COMPLETED, COMPLETED_WITH_ABORTS, TRAINED
from secure_fed.specs import dense_update_layers, instance_bound, layer_specs


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] | None = None
    #: private/summary.json: timing, setup facts and other statistics of private data (the operator's only)
    private: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def lock_run_dir(run_dir: Path):
    """Hold an exclusive lock on ``run_dir`` (``fcntl.flock`` on ``RUN_DIR/.lock``, created with the directory) while
    a run writes there: two processes training into one directory (a resume started while the run still goes)
    would interleave their checkpoints. The second is refused with one line; the lock ends with the process."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SecureFedError(f"{run_dir} is in use by another secure-fed process (a run or a resume); wait for it "
                                 "to end, or give another --out") from None  # fmt: skip
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class Experiment(CheckpointMixin, EvaluationMixin, ReportMixin):
    """A configured run. ``run()`` trains, evaluates, checkpoints and writes the run directory."""

    def __init__(self, cfg: ExperimentConfig, *, run_dir: str | Path, data_root: str | None = None, dataset: Any = None):
        """``dataset`` (a :class:`~secure_fed.data.MultiLabelDataset`) replaces the configured one (shadow runs)."""
        keep_freed_memory()  # a round's large tensors reuse freed memory instead of faulting pages in anew
        self.cfg = cfg
        self.data_root = data_root
        self.run_dir = Path(run_dir)
        self.device = resolve_device(cfg.device)
        if self.device.type == "cuda":
            use_deterministic_cuda()  # runs resume exactly: no atomic-add sums whose order varies
        self.dataset = dataset if dataset is not None else build_dataset(cfg, data_root)
        self.algorithm = build_algorithm(cfg, self.device)
        self.memory = plan_memory(cfg, self.dataset, self.device)
        check_memory(self.memory)  # a run that cannot fit stops here: nothing built, nothing written
        self.fed = build_federation(cfg, self.dataset, type(self.algorithm), self.device, bound=instance_bound(cfg))
        # the server's model as named tensors: θ (every client gets it whole) and, for families with one, the
        # row table W (each client gets only its own rows); a worker model for local training
        self.family = model_family(cfg.model.family)
        C, d = self.dataset.num_labels, cfg.model.embedding_dim
        # the simulator's copy of the server's model (θ; with FedLGT's label embeddings, computed like a client's
        # from the public names, only for scoring) and the clients' working model
        self.encoder = build_model(cfg, self.dataset, cache_dir=self.run_dir / "cache").to(self.device)
        self.worker = build_model(cfg, self.dataset, cache_dir=self.run_dir / "cache").to(self.device)
        if isinstance(self.fed.x_test, SparseRows):  # sparse rows: the first layer's weight stored as an (in, out) table
            column_major(self.encoder)
            column_major(self.worker)
        self.theta = {n: p.detach().clone() for n, p in self.encoder.named_parameters()}  # clones keep the layout
        gen = torch.Generator().manual_seed(cfg.seed * 104729 + 1)
        W = self.family.init_rows(C, d, generator=gen)
        self.W: torch.Tensor | None = None if W is None else W.to(self.device)
        # one optimiser for θ, one for W rows (used when server_optimizer.apply_to_rows is set)
        opt_args = cfg.training.server_optimizer.model_dump(exclude={"apply_to_rows"})
        # non-trainable θ entries (batch-norm running statistics) take the clients' mean under every optimiser
        frozen = frozenset(n for n, p in self.encoder.named_parameters() if not p.requires_grad)
        self.server_opt = ServerOptimizer(**opt_args, averaged=frozen)
        self.row_opt = ServerOptimizer(**opt_args)
        self.messages: list[dict[str, Any]] | None = [] if cfg.output.log_messages else None
        # a plaintext update of a sparse-input table as the columns the client touched, where every layer takes it
        row_sparse = (
            isinstance(self.fed.x_test, SparseRows) and cfg.training.sparse_updates is not False
            and not dense_update_layers(cfg)
        )  # fmt: skip
        # a batched group's plaintext weight updates formed when read, and summed by the group, where every layer
        # passes plaintext θ updates to the plain sum untouched (secure_fed.models.group_updates)
        # Only while nothing outside the engine holds the wire messages: a deferred update refers to the group that
        # trained it (every member's history), so registered callbacks (attack taps, canaries) and message logs
        # turn it off
        registered = build_callbacks(cfg)
        deferred = (
            cfg.training.executor == "vectorized" and cfg.backend != "flower"
            and cfg.training.deferred_updates is not False and not dense_update_layers(cfg)
            and not cfg.output.log_messages and not registered
        )  # fmt: skip
        if cfg.training.deferred_updates is True and registered:
            raise ConfigError(
                f"training.deferred_updates=true: callbacks {[type(cb).__name__ for cb in registered]} see the clients' "
                "messages, which must then hold dense updates; set training.deferred_updates: auto"
            )
        down, up = self._declared_message_rules(row_sparse=row_sparse, deferred=deferred)
        self.guard = MessageGuard(
            shapes=self.tensor_shapes(),
            visibility=self.algorithm.visibility,
            client_rows=self._client_rows(),
            down_rules=down,
            up_rules=up,
            log=self.messages,
        )
        self.stack_env = StackEnv(
            num_clients=len(self.fed.clients),
            clients_per_row=self._clients_per_row(),
            num_labels=C,
            embedding_dim=d,
            theta=self.theta,
            device=self.device,
            seed=cfg.seed,
            max_clients_per_instance=self.fed.max_clients_per_instance,
            has_rows=self.W is not None,
            full_table_keys=tuple(k for k, rule in up.items() if isinstance(rule, FullTable)),
            call_clients=lambda cids, payload_fn, client_fn, partial=False: self._query(
                list(cids), payload_fn, client_fn, partial=partial
            ),
        )
        self.stack = ProtocolStack(cfg, self.stack_env)
        self.stack.wrap_algorithm(self.algorithm)
        self.label_perm: np.ndarray | None = None  # simulator's view: label l lives in row label_perm[l]
        self.stop_reason: str | None = None
        self.trainer = LocalTrainer(self.worker, self.family)
        self.trainer.row_sparse_updates = row_sparse
        self.trainer.deferred_updates = deferred
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
        self.rounds_aborted = 0  #: rounds a protocol aborted (nothing applied; a DP layer still charges them)
        self.best: dict[str, Any] | None = None  #: centralised baselines: the best epoch on validation so far
        self.selected: dict[str, Any] | None = None  #: ... and, at the end, the reported one
        self.setup_facts: dict[str, Any] | None = None
        self.wall_before = 0.0
        #: on Flower: a public token naming this run to the nodes, under which each keeps its clients' state on its
        #: own storage (kept in the checkpoint, so a resumed run finds the nodes' state again)
        self.flower_session: str | None = None
        self._t0 = time.perf_counter()  #: wall clock of the current stretch of training (see ``elapsed``)
        #: the built-in callbacks, then the registered ones (``secure_fed.callbacks`` entry points, e.g. the attack
        #: taps of threat_models), then the checkpoint (which saves what the callbacks before it keep)
        self.callbacks: list[Callback] = [
            Evaluation(),
            ClientEvaluation(),
            PrivacyRecord(),
            MetricsFiles(),
            *([TensorBoardLog()] if cfg.output.tensorboard else []),
            *registered,
            Checkpointing(),
        ]
        self.executor = EXECUTORS[cfg.training.executor].from_config(cfg.training)
        self.trainer.batching = self.executor.batching  # the vectorised executor's: it trains a chunk's clients together
        for cb in self.callbacks:
            cb.on_init(self)

    def _declared_message_rules(self, *, row_sparse: bool = False, deferred: bool = False) -> tuple[Rules, Rules]:
        """The keys the guard allows, with their rules: the algorithm's, plus those of the layers this run lists.
        Without ``row_sparse`` (a run whose updates must be dense) a θ update may not carry touched columns; without
        ``deferred``, it may not be a deferred update."""
        specs = layer_specs()
        down, up = dict(self.algorithm.downlink_rules), dict(self.algorithm.uplink_rules)
        for key, rule in up.items():
            if isinstance(rule, Params) and (rule.row_sparse and not row_sparse or rule.deferred and not deferred):
                up[key] = dataclasses.replace(
                    rule, row_sparse=rule.row_sparse and row_sparse, deferred=rule.deferred and deferred
                )
        for name in self.cfg.protocols:
            down.update(specs[name].downlink_rules)
            up.update(specs[name].uplink_rules)
        return down, up

    def server_tensors(self) -> dict[str, Any]:
        """The server's model as named tensors: ``theta`` (a parameter dict) and ``W`` when the family has rows."""
        return {"theta": self.theta, **({"W": self.W} if self.W is not None else {})}

    def tensor_shapes(self) -> dict[str, Any]:
        return {k: ({n: tuple(t.shape) for n, t in v.items()} if isinstance(v, dict) else tuple(v.shape))
                for k, v in self.server_tensors().items()}  # fmt: skip

    def _client_rows(self) -> dict[int, set[int]]:
        """Each client's own rows of W: the rows of the labels it holds (after any keyed row order)."""
        return {c.client_id: {int(i) for i in c.known_labels} for c in self.fed.clients}

    def elapsed(self) -> float:
        """Wall seconds of training so far, across resumes."""
        return self.wall_before + time.perf_counter() - self._t0

    def _parameters_finite(self) -> bool:
        tensors = [*self.theta.values(), *([self.W] if self.W is not None else [])]
        return all(bool(torch.isfinite(t).all()) for t in tensors)

    def mean_row_cosine(self) -> float | None:
        """Mean pairwise cosine of W's rows (1.0: collapse); None without a row table."""
        return None if self.W is None else mean_pairwise_cosine(self.W)

    def callback(self, name: str) -> Callback | None:
        """The callback registered under ``name`` in this run, if any."""
        return next((cb for cb in self.callbacks if cb.name == name), None)

    # ----------------------------------------------------------------- channel
    def _exchange(self, cid: int, payload: dict, client_fn) -> dict:
        client = self.fed.clients[cid]
        self.guard.check_down(cid, payload)
        reply = client_fn(payload, client)
        self.guard.check_up(cid, reply)
        return reply

    def _query_all(self, payload_fn, client_fn) -> list[tuple[int, dict]]:
        return self._query([c.client_id for c in self.fed.clients], payload_fn, client_fn)

    def _query_one(self, cid: int, payload: dict, client_fn) -> dict:
        return self._query([cid], lambda _cid: payload, client_fn)[0][1]

    def _query(self, cids: list[int], payload_fn, client_fn, *, partial: bool = False) -> list[tuple[int, dict]]:
        """A setup-time exchange with ``cids``: in process, or through a remote executor (which sends the client
        function's registered name; the client runs its own copy). ``partial``: the caller takes the answers of the
        clients that answered (a remote client whose node fails or times out drops out of the exchange)."""
        if self.executor.remote:
            return self.executor.query(cids, payload_fn, client_fn, partial=partial)
        return [(cid, self._exchange(cid, payload_fn(cid), client_fn)) for cid in cids]

    def _channel(self, session: RoundSession | None = None) -> Channel:
        """The round's guarded channel: downlink checked before it leaves; the wire message logged and shown to the
        callbacks (the client's plaintext reply is checked on the client, inside :meth:`client_fn`)."""

        def up(cid: int, wire: dict) -> dict:
            self.guard.record("up", cid, wire)
            for cb in self.callbacks:
                cb.on_uplink(self.round, cid, wire)
            return wire

        def drop(cid: int, reason: str) -> None:
            if session is None:
                raise RuntimeError(f"client {cid} dropped out ({reason}) outside a round")
            session.drop(cid, reason)

        return Channel(
            down=lambda job: self.guard.check_down(job.cid, job.payload, plan=job.plan), up=up,
            client=lambda cid: self.fed.clients[cid], drop=drop,
        )  # fmt: skip

    def apply_row_order(self, perm) -> None:
        """Re-index labels: label l now lives in row perm[l] (a layer's row order, e.g. keyed label pseudonyms).
        Simulator bookkeeping: the clients' labels, the test labels and the guard's row ownership follow."""
        perm = np.asarray(perm, dtype=np.int64)
        if sorted(perm.tolist()) != list(range(self.dataset.num_labels)):
            raise ValueError("a row order must be a bijection on the labels")
        self.label_perm = perm if self.label_perm is None else perm[self.label_perm]
        t = torch.as_tensor(perm)
        for c in self.fed.clients:
            c.known_labels = t[c.known_labels]
        y = self.fed.y_test.tocsc()[:, np.argsort(perm)].tocsr()  # column perm[l] holds label l
        self.fed.y_test = y
        for c, rows in zip(self.fed.clients, self.fed.client_test or [], strict=False):
            if c.eval_y is not None:
                c.eval_y = y[rows].toarray()
        self.guard.set_client_rows(self._client_rows())
        self.stack_env.clients_per_row = self._clients_per_row()

    def _clients_per_row(self) -> torch.Tensor:
        """A public count of the clients each row of W is averaged over (a DP layer's fixed per-row divisor): 1 where
        each label has its own client (positive-only: structural), else every client of the federation (which
        clients hold a label is a fact of their data, so it may not divide a DP sum)."""
        one_each = all(s.label is not None for s in self.fed.shards)
        n = 1 if one_each else len(self.fed.clients)
        return torch.full((self.dataset.num_labels,), n, dtype=torch.long)

    # ----------------------------------------------------------------- rounds
    def setup(self) -> None:
        if self.setup_facts is not None:
            return
        facts = {}
        if self.stack:
            ctx = ProtocolSetup(
                query=self._query_all, query_one=self._query_one, clients=self.fed.clients,
                label_names=list(self.dataset.label_names),
            )  # fmt: skip
            facts = self.stack.setup(ctx, on_row_order=self.apply_row_order)
        query = self.stack.wrap_query(self._query_all)
        for cb in self.callbacks:
            query = cb.wrap_setup_query(query)
        ctx = SetupContext(
            query=query,
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
            self.rounds_aborted += 1
            return {"train_loss": float("nan"), "clients": 0, "aborted": str(e)}

    def _client_jobs(self, session: RoundSession):
        """The round's client jobs, built lazily: payload, and the client function wrapped innermost-first by the
        callbacks (canaries), the layers (clip, noise share) and the session (mask, encrypt)."""
        plan = tuple(session.client_plan()) if self.executor.remote else ()
        if plan:  # what every honest node will check: a layer whose session builds its plan another way is a bug here
            try:
                self.stack.check_client_plan(list(plan), round_idx=self.round)
            except PermissionError as e:
                raise RuntimeError(
                    f"this run's own client plan would be refused by its nodes ({e}); a layer's session must build its "
                    "steps with the layer's client_plan_steps"
                ) from None
        for cid in session.cohort:
            client = self.fed.clients[cid]
            payload = self.algorithm.downlink(self.theta, self.W, client.known_labels.to(self.device))
            fn = session.client_mod(self.stack.client_mod(self.client_fn(int(cid))))
            yield ClientJob(int(cid), payload, fn, plan)

    def client_fn(self, cid: int):
        """Client ``cid``'s training function in this round, client side: local training (DP-SGD when a layer gives
        a privatizer, from the client's own secret) inside the algorithm's ``client_update``, its plaintext reply
        checked against the algorithm's declarations, wrapped by the callbacks' client mods. A remote client
        (``backend: flower``) builds the same function from its own copy of the run."""
        round_idx = self.round
        gen = torch.Generator().manual_seed(client_seed(self.cfg.seed, round_idx, cid))

        def train(p, d):
            priv = self.stack.local_privatizer(cid, round_idx)  # client side: DP-SGD from the client's secret
            if priv is not None:
                for cb in self.callbacks:
                    priv = cb.wrap_privatizer(cid, round_idx, priv)
            reply = self.algorithm.client_update(p, d, lambda q: self.trainer.update(q, d, self.local, gen, priv))
            self.guard.check_up(cid, reply, record=False)  # the client's own update, before any protocol
            return reply

        for cb in self.callbacks:
            train = cb.client_mod(train)
        return train

    def _train_round(self) -> dict[str, Any]:
        cfg, algo = self.cfg, self.algorithm
        sizes = np.array([c.num_examples for c in self.fed.clients], dtype=float)
        secret = self.stack.cohort_uniforms(self.round, len(sizes))
        t = cfg.training
        size = cohort_size(t, len(sizes))
        chosen = sample_clients(sizes, t.client_fraction, t.sampling, cfg.seed, self.round, secret, size=size)
        base = RoundSession(cohort=[int(c) for c in chosen], theta=self.theta, W=self.W, weighting=cfg.training.aggregation)
        session = self.stack.open_round(self.round, base)
        for cid, wire in self.executor.run(self._client_jobs(session), self._channel(session)):
            session.submit(cid, wire)
            del wire  # not held while the executor trains the next clients (a deferred update holds its group)
        dropped = len(session.dropped)
        agg = session.finish()
        for cb in self.callbacks:
            cb.on_aggregate(self.round, list(session.cohort), agg)
        if agg.num_clients > 0 or agg.theta_denominator is not None:
            self.server_opt.step(self.theta, agg.theta_mean())
            if algo.trains_rows and self.W is not None:
                row_delta, seen = agg.rows_mean()
                if cfg.training.server_optimizer.apply_to_rows:
                    self.row_opt.step({"W": self.W}, {"W": row_delta}, masks={"W": seen})
                else:
                    self.W[seen] += row_delta[seen]
                self.W[seen] = self.family.project_rows(self.W[seen])
        labels = [self.fed.clients[int(c)].known_labels for c in session.cohort if int(c) not in session.dropped]
        loss = agg.loss_sum / agg.num_clients if agg.num_clients else float("nan")
        num_clients = agg.num_clients
        del agg, session, base  # the round's sums (a copy of θ) are not needed by the server step
        if labels:
            participating = torch.unique(torch.cat(labels)).to(self.device)
        else:  # an empty cohort (an empty draw, or every client dropped): no class took part
            participating = torch.zeros(0, dtype=torch.long, device=self.device)
        stats = algo.server_step(self.W, self.round, participating)
        self.stack.after_round(self.round)
        self.round += 1
        extra = {"clients_dropped": dropped} if dropped else {}
        return {"train_loss": loss, "clients": num_clients, **extra, **stats, **self.stack.round_stats()}

    def run(self, *, progress: bool | None = None) -> RunResult:
        """Train from the current round to ``training.rounds`` (or a budget stop), then write the final files: in
        this process, or with the clients on Flower nodes (``backend: flower``)."""
        if self.cfg.backend == "flower":
            from secure_fed.engine.flower.simulation import run_on_flower

            return run_on_flower(self, progress=progress)
        return self.run_rounds(progress=progress)

    def run_rounds(self, *, progress: bool | None = None) -> RunResult:
        """Train from the current round to ``training.rounds`` (or a budget stop), then write the final files; the
        run directory is locked meanwhile (:func:`lock_run_dir`: a second process is refused, not interleaved).

        Each round: the protocol layers may stop the run (budget), :meth:`train_round` runs it, then every
        callback adds to the round's records (``on_record``: evaluation, the privacy report) and sees them
        complete (``on_round_end``: metrics files, attack taps, checkpoint, progress bar)."""
        check_writable_dir(self.run_dir)
        with lock_run_dir(self.run_dir):
            return self._run_rounds(progress)

    def _train_rounds(self, callbacks: list[Callback]) -> str:
        """Train from the current round to ``training.rounds``, each round's records through ``callbacks``; returns
        how the loop ended: ``completed`` (``completed_with_aborts`` once the caller counts aborted rounds),
        ``budget_exhausted`` (a layer stopped it) or ``diverged``."""
        cfg = self.cfg
        while self.round < cfg.training.rounds:
            why = self.stack.budget_stop(self.round)
            if why is not None:
                self.stop_reason = why
                return "budget_exhausted"
            stats = self.train_round()
            diag = {"round": self.round, **stats}
            if not self._parameters_finite():
                self.stop_reason = (
                    f"training diverged in round {self.round}: θ or W became non-finite (lower the learning rates "
                    "or the regulariser's step)"
                )
                self.diagnostics.append(diag)  # kept in private/diagnostics.jsonl; no checkpoint of NaNs
                return "diverged"
            rec: dict[str, Any] = {"round": self.round}
            for cb in callbacks:
                cb.on_record(self, rec, diag)
            diag["wall_seconds"] = self.elapsed()
            self.history.append(rec)
            self.diagnostics.append(diag)
            for cb in callbacks:
                cb.on_round_end(self, rec, diag)
        return "completed"

    def _run_rounds(self, progress: bool | None) -> RunResult:
        cfg = self.cfg
        (self.run_dir / "config.yaml").write_text(dump_config(cfg))
        progress = cfg.output.progress if progress is None else progress
        callbacks = [*self.callbacks, *([ProgressBar()] if progress else [])]
        self._t0 = time.perf_counter()
        self.setup()
        for cb in callbacks:
            cb.on_run_start(self)
        try:
            with long_lived_frozen():  # the run's data, models and libraries: out of the collector's full scans
                status = self._train_rounds(callbacks)
        except KeyboardInterrupt:
            status = "interrupted"
        if status == "completed" and self.round > 0 and self.rounds_aborted >= self.round:
            status = "failed"
            self.stop_reason = (
                f"no round completed: all {self.round} rounds aborted (a protocol could not finish them; "
                "the reasons are in private/diagnostics.jsonl)"
            )
        elif status == COMPLETED and self.rounds_aborted:  # finished, but not every round was applied
            status = COMPLETED_WITH_ABORTS
        for cb in callbacks:
            cb.on_run_end(self, status)
        self.callback("metrics_files").rewrite(self)  # whatever stopped the loop, the files match the records
        self.wall_before = self.elapsed()
        self._t0 = time.perf_counter()
        if status != "diverged":  # a diverged run keeps its last good checkpoint, to resume from with other settings
            self.save_checkpoint()
        if status in TRAINED:
            self._restore_selected()
            self.save_checkpoint("final.pt", side_files=False)
        summary, private = self.summary(status), self.private_summary()
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        (self.run_dir / PRIVATE_DIR).mkdir(exist_ok=True)
        (self.run_dir / PRIVATE_DIR / "summary.json").write_text(json.dumps(private, indent=2, default=str))
        return RunResult(self.run_dir, summary, self.history, self.messages, private)
