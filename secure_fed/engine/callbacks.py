"""Callbacks: code that observes or instruments a run without the engine knowing what it is.

Plugins register factories under the ``secure_fed.callbacks`` entry points; each factory gets the
config and returns a :class:`Callback` or ``None`` (not needed for this run). The engine calls the
hooks below at fixed points of a round (see the README's architecture table). ``threat_models``
uses them to record the server's view and to insert the auditor's canaries.

A hook reads the run through a :class:`~secure_fed.engine.run_context.RunContext`, never the run object. The
built-in callbacks live beside what they do: :mod:`~secure_fed.engine.evaluation` (test metrics, the clients'
own models), :mod:`~secure_fed.engine.privacy_record`, :mod:`~secure_fed.engine.run_summaries` (metrics files, the
summaries), :mod:`~secure_fed.engine.checkpoints`; here the base class and the progress bar and TensorBoard log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from secure_fed.algorithms.base import ClientFn
from secure_fed.engine.aggregation import Aggregate
from secure_fed.engine.run_context import RunContext
from secure_fed.errors import PrivacyViolation
from secure_fed.plan import RunPlan
from secure_fed.run_files import PRIVACY_RECORD, private_dir


class Callback:
    """Every hook does nothing by default; override the ones you need."""

    #: a short name (used to find the callback in a run: :meth:`RunContext.callback`)
    name: ClassVar[str] = ""

    def on_init(self, ctx: RunContext) -> None:
        """The experiment is built (data, model, layers); before setup and before any resume."""

    def wrap_setup_query(self, query):
        """Wrap the server's setup-time exchange with every client (label-set collection)."""
        return query

    def acts_on_clients(self) -> bool:
        """True when this callback, in this run, changes code that runs on the clients (:meth:`client_mod`,
        :meth:`wrap_privatizer`): a remote back end must then carry it to the clients. Default: whether the class
        overrides either (a callback that does so only in some runs says when)."""
        cls = type(self)
        return cls.client_mod is not Callback.client_mod or cls.wrap_privatizer is not Callback.wrap_privatizer

    def client_mod(self, fn: ClientFn) -> ClientFn:
        """Wrap each client's training function, innermost: before any protocol layer sees the update."""
        return fn

    def reports_from_remote_clients(self) -> bool:
        """True when this callback's client-side work runs on remote clients too (``backend: flower``): each node
        runs its own copy of the callback inside its clients' functions, and what that copy measured reaches the
        server as a report (:meth:`client_report` on the node, :meth:`on_client_report` on the server). A callback
        that acts on clients without saying so is refused on a remote back end."""
        return False

    def client_report(self, ctx: RunContext, cid: int) -> dict[str, float]:
        """Client side, on a remote node, after client ``cid``'s function ran: the numbers this callback measured
        there that the server may learn (sent beside the reply, outside the guarded payload); empty for none."""
        return {}

    def on_client_report(self, ctx: RunContext, cid: int, report: dict[str, float]) -> None:
        """Server side: a remote client's :meth:`client_report` as it arrives."""
        raise PrivacyViolation(f"client {cid} sent a report for callback {self.name!r}, which takes none")

    def wrap_privatizer(self, cid: int, round_idx: int, privatizer):
        """Wrap client ``cid``'s DP-SGD (a :class:`~secure_fed.algorithms.per_sample.GradientPrivatizer`) for this
        round, e.g. to insert an auditor's gradient canaries; only called when a layer gives one."""
        return privatizer

    def on_uplink(self, round_idx: int, cid: int, wire: dict[str, Any]) -> None:
        """A client's message as it crosses the wire (masked or encrypted under a secure-sum layer)."""

    def on_aggregate(self, round_idx: int, cohort: list[int], agg: Aggregate) -> None:
        """The round's aggregate as the server obtains it, before the server step."""

    def on_run_start(self, ctx: RunContext) -> None:
        """``Experiment.run`` starts (after setup and any resume)."""

    def on_record(self, ctx: RunContext, record: dict[str, Any], diagnostics: dict[str, Any]) -> None:
        """Add to a round's public record (``metrics.jsonl``: the released model's metrics, the privacy report
        only) or to its private diagnostics, in callback order. What goes in ``record`` is tagged
        (:func:`secure_fed.release.public` or :func:`~secure_fed.release.protected`): an untagged value makes the
        run's ε ∞ (strict mode: raises)."""

    def on_round_end(self, ctx: RunContext, record: dict[str, Any], diagnostics: dict[str, Any]) -> None:
        """A round's public record (``metrics.jsonl``) and private diagnostics are complete."""

    def on_run_end(self, ctx: RunContext, status: str) -> None:
        """Training stopped (completed, budget exhausted, interrupted, diverged or failed), in callback order: the
        last records are completed and written, then the checkpoint saves the run's last state."""

    def on_release(self, ctx: RunContext, status: str) -> None:
        """After :meth:`on_run_end`, in callback order: the released model is chosen (a centralised baseline's
        selected epoch), checkpointed as ``final.pt`` and reported (``summary.json``)."""

    def on_cli_run_end(self, ctx: RunContext, result: Any) -> None:
        """``secure-fed run`` has finished training, with its :class:`~secure_fed.engine.runner.RunResult` (the attack
        taps run the configured attacks here)."""

    def state_files(self) -> dict[str, Any]:
        """File name → state to save in ``private/checkpoints/`` beside the server's checkpoint (kept apart from it)."""
        return {}

    def load_state_files(self, checkpoint_dir: Path) -> None:
        """Restore what :meth:`state_files` saved (on resume)."""

    def checkpoint_state(self, ctx: RunContext) -> dict[str, Any]:
        """Entries this callback adds to the server's own checkpoint (``last.pt``), e.g. the evaluation's best epoch."""
        return {}

    def load_checkpoint_state(self, ctx: RunContext, state: dict[str, Any]) -> None:
        """Restore this callback's entries from the server's checkpoint ``state`` (on resume)."""


def build_callbacks(plan: RunPlan) -> list[Callback]:
    """Every registered factory's callback for this run's ``plan`` (factories return None when not needed)."""
    from secure_fed.plugins import registry

    out = []
    for factory in registry("callbacks").values():
        cb = factory(plan)
        if cb is not None:
            out.append(cb)
    return out


class TensorBoardLog(Callback):
    """``output.tensorboard``: the released metrics of each round and its (ε, δ) as TensorBoard scalars in
    ``RUN_DIR/private/tensorboard/`` (``tensorboard --logdir RUN_DIR/private/tensorboard``). Only what
    ``metrics.jsonl`` holds, but under ``private/`` all the same: an event file's name and each event carry the wall
    clock, i.e. how long each round trained, which depends on the data. A resumed run purges the events after its
    checkpoint's round."""

    name = "tensorboard"

    def __init__(self):
        self.writer = None

    def on_run_start(self, ctx) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(private_dir(ctx.run_dir) / "tensorboard"), purge_step=ctx.round + 1)

    def on_round_end(self, ctx, record, diagnostics) -> None:
        step = int(record["round"])
        for key, value in record.items():
            if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"test/{key}", value, step)
        priv = record.get(PRIVACY_RECORD, {})
        for unit in ("instance", "client"):
            if unit in priv and isinstance(priv[unit].get("epsilon"), (int, float)):
                self.writer.add_scalar(f"privacy/epsilon_{unit}", priv[unit]["epsilon"], step)
        self.writer.flush()

    def on_run_end(self, ctx, status) -> None:
        if self.writer is not None:
            self.writer.close()


class ProgressBar(Callback):
    """A tqdm bar for the rounds (``output.progress``), with what the round's public record holds: ε spent so far
    (the released ledger: per DP unit, and ∞ for the released model when no unit bounds it) and the latest test
    metric. No private statistic: the training loss and clipping counts are the operator's diagnostics."""

    name = "progress_bar"

    def __init__(self):
        self.bar = None

    def on_run_start(self, ctx) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=ctx.plan.training.rounds, initial=ctx.round, desc=ctx.plan.algorithm.name, unit="round",
                        mininterval=1.0)  # fmt: skip

    def on_round_end(self, ctx, record, diagnostics) -> None:  # diagnostics: private, never shown
        from secure_fed.privacy_lines import fmt_epsilon

        priv = record.get(PRIVACY_RECORD) or {}
        units = {k: v for k, v in priv.items() if isinstance(v, dict) and "epsilon" in v}
        # the released model's ε first (the observer's), then each unit's own ledger, named as a unit's
        post = {"ε model": fmt_epsilon(priv.get("epsilon"))}
        for unit, u in units.items():
            post[f"{unit} unit"] = fmt_epsilon(u["epsilon"])
        if "mAP" in record:
            head = next((k for k in record if k.startswith("P@")), "mAP")
            post[head] = f"{record[head]:.2f}"
            if record.get("W_mean_cos") is not None:
                post["cos(W)"] = f"{record['W_mean_cos']:.3f}"
        self.bar.set_postfix(post, refresh=False)  # drawn by update(), at most once a mininterval
        self.bar.update(1)

    def on_run_end(self, ctx, status) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
