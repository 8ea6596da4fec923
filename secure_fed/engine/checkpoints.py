"""What a checkpoint holds, and how a run saves and resumes it: the :class:`Checkpointing` callback.

A run directory's ``private/checkpoints/`` (operator-only, never released) keeps each party's state apart:
``last.pt``/``final.pt`` the server's (θ, W, optimiser moments, the algorithm's state, the privacy ledger, the
records), ``clients.pt`` what the clients keep (protocol secrets, noise keys, the keyed label order),
``server_secrets.pt`` the server's private keys (the secret behind its DP noise and sampling), and each
callback's files (e.g. the server's recorded view, the auditor's canaries). A checkpoint's files become current
together (:mod:`~secure_fed.engine.checkpoint_commit`): a kill leaves the previous checkpoint whole, or the new one
committed and completed on resume; tensors are saved on the CPU (portable across devices).

The callback reads the run through its :class:`~secure_fed.engine.run_context.RunContext` (the model state, the
records, the protocol stack's parties' state, the row order, the other callbacks' state) and keeps no state of
its own beyond when to save.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from secure_fed.engine.callbacks import Callback
from secure_fed.engine.checkpoint_commit import commit_files, finish_commit, lock_run_dir
from secure_fed.engine.run_context import RunContext
from secure_fed.engine.tensor_tree import to_cpu, to_device
from secure_fed.errors import SecureFedError, one_line
from secure_fed.plan import RunPlan
from secure_fed.plugin_specs import layer_specs, privacy_accounting_layers
from secure_fed.run_files import CHECKPOINT_COMMIT, checkpoint_dir, operator_config_path
from secure_fed.run_status import TRAINED

CHECKPOINT_VERSION = 3


#: what a resumed run may not change (`secure-fed resume RUN --set …`, a Flower resume, a sweep): the settings that
#: give the checkpoint its meaning (the data and its split among clients, the model's shape, the algorithm, the
#: listed layers); each layer's spec adds its own sections (its keys, the privacy ledger's units:
#: ``LayerSpec.frozen_on_resume``). The rest may change, e.g. more rounds, lower learning rates for a diverged run,
#: where the data lie (``dataset.root``), what is reported
FROZEN_ON_RESUME = (("seed",), ("dataset",), ("partition",), ("model",), ("algorithm", "name"), ("protocols",))
#: inside those, what may still change (and each layer's ``LayerSpec.movable_on_resume``)
MOVABLE_ON_RESUME = (("dataset", "root"),)


def frozen_on_resume() -> tuple[tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...]]:
    """The frozen keys and the movable keys inside them: the core's, then every registered layer's (listed or not:
    a layer's section keeps its meaning for the checkpoint whether or not the run lists the layer)."""
    specs = layer_specs().values()
    frozen = FROZEN_ON_RESUME + tuple(k for s in specs for k in s.frozen_on_resume if k not in FROZEN_ON_RESUME)
    # a spec may free keys only inside the sections it froze itself (never the core's, never another layer's)
    movable = tuple(k for s in specs for k in s.movable_on_resume if any(k[: len(f)] == f for f in s.frozen_on_resume))
    return tuple(dict.fromkeys(frozen)), MOVABLE_ON_RESUME + movable


def resume_change(recorded: RunPlan, plan: RunPlan) -> str | None:
    """The first setting of :func:`frozen_on_resume` (less its movable keys) that ``plan`` changes from the
    ``recorded`` plan (their validated configs, :attr:`~secure_fed.plan.RunPlan.config_yaml`), as
    ``key: recorded there, new now``; None when there is none."""
    import yaml

    from secure_fed.config import first_difference

    keys, movable = frozen_on_resume()

    def frozen(p: RunPlan) -> dict[str, Any]:
        doc = yaml.safe_load(p.config_yaml)
        for section, key in movable:
            (doc.get(section) or {}).pop(key, None)
        return {".".join(p): functools.reduce(lambda d, k: (d or {}).get(k), p, doc) for p in keys}

    old, new = frozen(recorded), frozen(plan)
    if old == new:
        return None
    key = next(k for k in old if old[k] != new[k])
    return first_difference(old[key], new[key], key)


def load_checkpoint_file(path: Path) -> Any:
    """``torch.load`` of one of a run's checkpoint files; a file that does not read is one error naming it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - unpickling a damaged file raises anything from EOFError to RuntimeError
        raise SecureFedError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {one_line(str(exc))[:120]})") from None


class Checkpointing(Callback):
    """Every ``output.checkpoint_every`` rounds (before the last), every party's state; at the run's end its last
    state (``last.pt``, unless training diverged: the last good checkpoint stays) and, once the released model is
    chosen, ``final.pt``. :meth:`resume` loads them back."""

    name = "checkpointing"

    def on_round_end(self, ctx, record, diagnostics) -> None:
        if ctx.round % ctx.plan.output.checkpoint_every == 0 and ctx.round < ctx.plan.training.rounds:
            self.save(ctx)

    def on_run_end(self, ctx, status) -> None:
        ctx.records.bank_time()
        if status != "diverged":  # a diverged run keeps its last good checkpoint, to resume from with other settings
            self.save(ctx)

    def on_release(self, ctx, status) -> None:
        if status in TRAINED:
            self.save(ctx, "final.pt", side_files=False)

    # ----------------------------------------------------------------- what each party keeps
    @staticmethod
    def server_state(ctx: RunContext) -> dict[str, Any]:
        """The server's checkpoint (``last.pt``): θ, W, the optimisers, the algorithm, the ledger, the records."""
        m, rec = ctx.model, ctx.records
        extra = {k: v for cb in ctx.callbacks for k, v in cb.checkpoint_state(ctx).items()}
        return {
            "version": CHECKPOINT_VERSION,
            "round": rec.round,
            "theta": {n: t.cpu() for n, t in m.theta.items()},
            "W": None if m.W is None else m.W.cpu(),
            "server_opt": to_cpu(m.server_opt.state_dict()),
            "row_opt": to_cpu(m.row_opt.state_dict()),
            "algorithm": to_cpu(ctx.algorithm.state_dict()),
            "protocols": ctx.stack.state_dict(),
            "setup_facts": rec.setup_facts,
            "history": rec.history,
            "diagnostics": rec.diagnostics,
            "rounds_aborted": rec.rounds_aborted,
            "release_findings": rec.release_findings,
            **extra,
            "wall_seconds": rec.wall_before,
            "flower_session": rec.flower_session,
        }

    @staticmethod
    def load_server_state(ctx: RunContext, sd: dict[str, Any]) -> None:
        m, rec = ctx.model, ctx.records
        rec.round = sd["round"]
        m.theta = {n: t.to(ctx.device) for n, t in sd["theta"].items()}
        m.W = None if sd["W"] is None else sd["W"].to(ctx.device)
        m.server_opt.load_state_dict(sd["server_opt"], ctx.device)
        m.row_opt.load_state_dict(sd["row_opt"], ctx.device)
        if sd["setup_facts"] is not None:
            ctx.algorithm.load_state_dict(sd["algorithm"])
        rec.setup_facts = sd["setup_facts"]
        ctx.stack.load_state_dict(sd.get("protocols", {}))
        rec.history = sd["history"]
        rec.diagnostics = sd.get("diagnostics", [])
        rec.rounds_aborted = sd.get("rounds_aborted", 0)
        rec.release_findings = list(sd.get("release_findings", []))
        for cb in ctx.callbacks:
            cb.load_checkpoint_state(ctx, sd)
        rec.wall_before = sd["wall_seconds"]
        rec.flower_session = sd.get("flower_session")

    @staticmethod
    def client_state(ctx: RunContext) -> dict[str, Any]:
        """What the clients (and the simulator) keep on their own side: protocol secrets, the label re-indexing."""
        return {
            "protocols": ctx.stack.client_state_dict(),
            "label_perm": ctx.row_order.perm,
            "client_state": {c.client_id: to_cpu(c.state) for c in ctx.fed.clients if c.state},  # e.g. local's θ_c
        }

    def save(self, ctx: RunContext, name: str = "last.pt", *, side_files: bool = True) -> Path:
        """Save the server's state as ``name``, and (``side_files``) the other parties' files beside it; ``final.pt``
        is saved right after ``last.pt`` and passes ``side_files=False``, since those files have not changed."""
        ctx.records.bank_time()  # the training time so far goes into the checkpoint
        ckpt_dir = checkpoint_dir(ctx.run_dir)
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        files = []
        if side_files:  # each stamped with the round, so that resume can tell files of two checkpoints apart
            files += [
                ("clients.pt", {**self.client_state(ctx), "round": ctx.round}),  # the clients' own storage
                ("server_secrets.pt", {"protocols": ctx.stack.secret_state_dict(), "round": ctx.round}),  # its keys
            ]
            for cb in ctx.callbacks:  # e.g. the server's recorded view and the auditor's secrets, kept apart
                files.extend(cb.state_files().items())
        files.append((name, self.server_state(ctx)))
        commit_files(ckpt_dir, files, ctx.round)  # all current together, or none (a crash in the moves is redone)
        return ckpt_dir / name

    # ----------------------------------------------------------------- resume
    @staticmethod
    def check_same_run(ctx: RunContext) -> None:
        """The config resumed with may not change what the run directory's checkpoint means (:func:`resume_change`),
        against the operator's config (``private/config.yaml``: the released one lacks the secret settings)."""
        saved = operator_config_path(ctx.run_dir)
        if not saved.is_file():
            return
        from secure_fed.config import load_plan

        try:
            recorded = load_plan(saved)
        except SecureFedError as exc:
            raise SecureFedError(f"cannot resume {ctx.run_dir}: its private/config.yaml no longer loads ({exc})") from None
        if change := resume_change(recorded, ctx.plan):
            raise SecureFedError(
                f"cannot resume {ctx.run_dir} with {change}: the data, partition, model, algorithm, seed, protocol "
                "layers and privacy settings stay as recorded (start a new run to change them)"
            )

    @staticmethod
    def check_fresh_start(ctx: RunContext, ckpt: Path) -> None:
        """A run directory without ``last.pt`` starts afresh, unless that would hide what the run already did: it
        wrote ``last.pt`` (its ``final.pt``, or a summary of any ending but divergence, which alone saves none), or,
        under DP, it released rounds or drew secrets before its first checkpoint (training again from round 0 with a
        fresh ledger would spend the budget twice and report it once)."""
        summary = ctx.run_dir / "summary.json"
        if (ckpt / "final.pt").is_file() or (summary.is_file() and '"diverged"' not in summary.read_text()):
            raise SecureFedError(f"cannot resume {ctx.run_dir}: {ckpt / 'last.pt'} is missing (the run wrote it); "
                                 "restore it, or start a new run")  # fmt: skip
        metrics = ctx.run_dir / "metrics.jsonl"
        released = metrics.is_file() and metrics.read_text().strip() != ""
        drawn = any((ckpt / f).is_file() for f in ("clients.pt", "server_secrets.pt"))
        if privacy_accounting_layers(ctx.plan) and (released or drawn):
            raise SecureFedError(
                f"cannot resume {ctx.run_dir}: it has no checkpoint, but it already "
                + ("released rounds in metrics.jsonl" if released else "saved secrets")
                + "; training again from round 0 would spend its privacy budget twice. Start a new run directory"
            )

    def resume(self, ctx: RunContext) -> bool:
        """Load ``private/checkpoints/last.pt`` if present; returns whether it did. A run that has no ``last.pt`` yet (stopped
        before its first checkpoint, or diverged in it) starts afresh; one whose ``last.pt`` is gone although the
        run wrote it (its ``final.pt`` or ``summary.json`` is there), or whose checkpoint files are missing or do not
        read, is an error: never a silent restart, never a new secret in place of a lost one."""
        ckpt = checkpoint_dir(ctx.run_dir)
        path = ckpt / "last.pt"
        self.check_same_run(ctx)
        if (ckpt / CHECKPOINT_COMMIT).is_file():  # a crash while its files were moved in place: finish the moves
            with lock_run_dir(ctx.run_dir):
                finish_commit(ckpt)
        if not path.is_file():
            self.check_fresh_start(ctx, ckpt)
            return False
        if not (ckpt / "clients.pt").is_file():  # saved with every last.pt: the clients' keys and storage
            raise SecureFedError(f"cannot resume {ctx.run_dir}: {ckpt / 'clients.pt'} is missing (written with every "
                                 "last.pt; fresh client keys would not continue the run)")  # fmt: skip
        secrets_path = ckpt / "server_secrets.pt"
        if not secrets_path.is_file() and any(ctx.stack.secret_state_dict().values()):
            raise SecureFedError(f"cannot resume {ctx.run_dir}: {secrets_path} is missing (it holds the server's "
                                 "secrets, e.g. its DP noise key; a fresh one would not continue the run)")  # fmt: skip
        cs = load_checkpoint_file(ckpt / "clients.pt")
        ctx.stack.load_client_state_dict(cs["protocols"])
        if cs["label_perm"] is not None:
            ctx.row_order.apply(cs["label_perm"])
        for cid, state in cs.get("client_state", {}).items():
            ctx.fed.clients[cid].state = to_device(state, ctx.device)
        lost = [layer.name for layer in ctx.stack.layers
                if layer.client_state_on_nodes and not any(layer.client_state_dict().values())]  # fmt: skip
        if ctx.algorithm.keeps_client_state and not any(c.state for c in ctx.fed.clients):
            lost.append(f"algorithm {ctx.algorithm.name}")
        if lost and ctx.plan.backend != "flower":
            raise SecureFedError(
                f"cannot resume {ctx.run_dir} in process: the clients' state of {', '.join(lost)} (keys, secret "
                "streams or models) is not in private/checkpoints/clients.pt; the run's clients kept it on Flower nodes. "
                "Start a new run"
            )
        sd = load_checkpoint_file(path)
        secrets = load_checkpoint_file(secrets_path) if secrets_path.is_file() else None
        stamps = {f: doc["round"] for f, doc in (("clients.pt", cs), ("server_secrets.pt", secrets))
                  if isinstance(doc, dict) and "round" in doc}  # fmt: skip
        if other := {f: r for f, r in stamps.items() if r != sd["round"]}:
            raise SecureFedError(
                f"cannot resume {ctx.run_dir}: last.pt is of round {sd['round']} but "
                + ", ".join(f"{f} of round {r}" for f, r in other.items())
                + " (a crash between their writes); restore files of one checkpoint, or start a new run"
            )
        self.load_server_state(ctx, sd)
        if secrets is not None:
            ctx.stack.load_secret_state_dict(secrets["protocols"])
        for cb in ctx.callbacks:
            cb.load_state_files(ckpt)
        return True
