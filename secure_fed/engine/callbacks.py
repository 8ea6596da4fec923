"""Callbacks: code that observes or instruments a run without the engine knowing what it is.

Plugins register factories under the ``secure_fed.callbacks`` entry points; each factory gets the
config and returns a :class:`Callback` or ``None`` (not needed for this run). The engine calls the
hooks below at fixed points of a round (see the README's architecture table). ``threat_models``
uses them to record the server's view and to insert the auditor's canaries.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from secure_fed.algorithms.base import ClientFn
from secure_fed.engine.evaluation import client_maps, spread
from secure_fed.errors import PrivacyViolation

if TYPE_CHECKING:
    from secure_fed.engine.aggregation import Aggregate
    from secure_fed.engine.runner import Experiment, RunResult


class Callback:
    """Every hook does nothing by default; override the ones you need."""

    #: a short name (used to find the callback on an experiment: :meth:`Experiment.callback`)
    name: ClassVar[str] = ""

    def on_init(self, exp: Experiment) -> None:
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

    def client_report(self, exp: Experiment, cid: int) -> dict[str, float]:
        """Client side, on a remote node, after client ``cid``'s function ran: the numbers this callback measured
        there that the server may learn (sent beside the reply, outside the guarded payload); empty for none."""
        return {}

    def on_client_report(self, exp: Experiment, cid: int, report: dict[str, float]) -> None:
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

    def on_run_start(self, exp: Experiment) -> None:
        """``Experiment.run`` starts (after setup and any resume)."""

    def on_record(self, exp: Experiment, record: dict[str, Any], diagnostics: dict[str, Any]) -> None:
        """Add to a round's public record (``metrics.jsonl``: the released model's metrics, the privacy report
        only) or to its private diagnostics, in callback order."""

    def on_round_end(self, exp: Experiment, record: dict[str, Any], diagnostics: dict[str, Any]) -> None:
        """A round's public record (``metrics.jsonl``) and private diagnostics are complete."""

    def on_run_end(self, exp: Experiment, status: str) -> None:
        """Training stopped (completed, budget exhausted, interrupted or failed); before the final files."""

    def on_cli_run_end(self, exp: Experiment, result: RunResult) -> None:
        """``secure-fed run`` has finished training (the attack taps run the configured attacks here)."""

    def state_files(self) -> dict[str, Any]:
        """File name → state to save in ``checkpoints/`` beside the server's checkpoint (kept apart from it)."""
        return {}

    def load_state_files(self, checkpoint_dir: Path) -> None:
        """Restore what :meth:`state_files` saved (on resume)."""


def build_callbacks(cfg) -> list[Callback]:
    """Every registered factory's callback for this config (factories return None when not needed)."""
    from secure_fed.plugins import registry

    out = []
    for factory in registry("callbacks").values():
        cb = factory(cfg)
        if cb is not None:
            out.append(cb)
    return out


# ----------------------------------------------------------------------------------- built-in callbacks
class Evaluation(Callback):
    """Test metrics every ``evaluation.every`` rounds and after the last; a centralised baseline also scores its
    validation split to select the epoch it reports. A run stopped by its privacy budget evaluates the model as
    released at the stop."""

    name = "evaluation"

    def on_record(self, exp, record, diagnostics) -> None:
        if exp.is_evaluation_round(exp.round):
            record.update(exp.evaluation_record())
            exp.select_on_validation(diagnostics)

    def on_run_end(self, exp, status) -> None:
        from secure_fed.engine.reporting import evaluated

        if status == "budget_exhausted" and exp.history and not evaluated(exp.history[-1]):
            exp.history[-1].update(exp.evaluation_record())


class ClientEvaluation(Callback):
    """AmAP and WmAP (the FLAG paper §5.1): in an evaluation round, each client scores its own model after its
    local training (:meth:`Algorithm.client_model`) on its own test rows, client side, and the round's record gets
    the mean, the std over clients and the worst client's mAP.

    These are metrics of models no DP mechanism protects (the clients' local models), so in a run with DP they go
    to the private diagnostics, not to ``metrics.jsonl``; without DP (ε = ∞) they are released beside the others.
    Active only in the general setting (clients hold test rows) with a model family without a row table.

    On Flower each node's copy computes its clients' mAPs and reports them to the server beside the reply, only
    in a run without protocol layers, where the server sees each client's plaintext update anyway (under DP a
    client's mAP is a statistic of its data that no mechanism protects, and under a secure sum the server must not
    learn per-client values: it stays on the node and these metrics are not measured); the server refuses a report
    in a run with layers."""

    name = "client_evaluation"

    def __init__(self):
        self.exp = None
        self.maps: dict[int, float] = {}

    def on_init(self, exp) -> None:
        active = exp.fed.client_test is not None and not exp.algorithm.centralized and exp.W is None
        self.exp = exp if active else None

    def acts_on_clients(self) -> bool:
        return self.exp is not None

    def client_mod(self, fn: ClientFn) -> ClientFn:
        exp = self.exp
        if exp is None:
            return fn

        def evaluated(payload, data):
            reply = fn(payload, data)
            if exp.is_evaluation_round(exp.round + 1) and data.eval_x is not None and len(data.eval_x):
                scores = exp.model_scores(exp.algorithm.client_model(payload, data, reply), data.eval_x)
                found = client_maps(scores, data.eval_y, [np.arange(len(data.eval_y))])
                if found:
                    self.maps[data.client_id] = found[0]
            return reply

        return evaluated

    def reports_from_remote_clients(self) -> bool:
        return True

    def client_report(self, exp, cid: int) -> dict[str, float]:
        found = self.maps.pop(cid, None)
        if found is None or exp.stack:  # under a protocol layer the client's mAP stays on its node
            return {}
        return {"mAP": float(found)}

    def on_client_report(self, exp, cid: int, report: dict[str, float]) -> None:
        if self.exp is None or exp.stack or set(report) != {"mAP"}:
            raise PrivacyViolation(f"client {cid}'s client-evaluation report {sorted(report)} is not allowed in this run")
        self.maps[cid] = float(report["mAP"])

    def on_record(self, exp, record, diagnostics) -> None:
        if self.exp is None or not self.maps:
            return
        stats = spread([self.maps[c] for c in sorted(self.maps)], "AmAP", worst="WmAP")
        self.maps = {}
        (diagnostics if exp.stack.privacy() else record).update(stats)


class PrivacyRecord(Callback):
    """The privacy ledger's (ε, δ) so far on every metrics line (ε = ∞ without DP)."""

    name = "privacy_record"

    def on_record(self, exp, record, diagnostics) -> None:
        record["privacy"] = exp.privacy_now()


class Checkpointing(Callback):
    """Every ``output.checkpoint_every`` rounds (before the last), every party's state (see
    :mod:`secure_fed.engine.checkpoints`); the run's end saves its own."""

    name = "checkpointing"

    def on_round_end(self, exp, record, diagnostics) -> None:
        if exp.round % exp.cfg.output.checkpoint_every == 0 and exp.round < exp.cfg.training.rounds:
            exp.save_checkpoint()


class MetricsFiles(Callback):
    """``metrics.jsonl`` (released) and ``private/diagnostics.jsonl`` (the operator's): one line per round,
    appended, flushed and fsync'd; a resumed run first truncates both to its checkpoint's rounds."""

    name = "metrics_files"

    def _paths(self, exp) -> tuple[Path, Path]:
        return exp.run_dir / "metrics.jsonl", exp.run_dir / "private" / "diagnostics.jsonl"

    def rewrite(self, exp) -> None:
        """Both files exactly as the experiment's records are now (atomically)."""
        for path, recs in zip(self._paths(exp), (exp.history, exp.diagnostics), strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".jsonl.tmp")
            with tmp.open("w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in recs)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(path)

    def on_run_start(self, exp) -> None:
        self.rewrite(exp)  # a resumed run: drop lines written after the checkpoint it resumed from

    def on_round_end(self, exp, record, diagnostics) -> None:
        for path, rec in zip(self._paths(exp), (record, diagnostics), strict=True):
            with path.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                os.fsync(fh.fileno())


class TensorBoardLog(Callback):
    """``output.tensorboard``: the released metrics of each round and its (ε, δ) as TensorBoard scalars in
    ``RUN_DIR/tensorboard/`` (``tensorboard --logdir RUN_DIR/tensorboard``). Only what ``metrics.jsonl`` holds:
    the private diagnostics (training loss, clipping statistics) stay in ``private/``. A resumed run purges the
    events after its checkpoint's round."""

    name = "tensorboard"

    def __init__(self):
        self.writer = None

    def on_run_start(self, exp) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(exp.run_dir / "tensorboard"), purge_step=exp.round + 1)

    def on_round_end(self, exp, record, diagnostics) -> None:
        step = int(record["round"])
        for key, value in record.items():
            if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"test/{key}", value, step)
        priv = record.get("privacy", {})
        for unit in ("instance", "client"):
            if unit in priv and isinstance(priv[unit].get("epsilon"), (int, float)):
                self.writer.add_scalar(f"privacy/epsilon_{unit}", priv[unit]["epsilon"], step)
        self.writer.flush()

    def on_run_end(self, exp, status) -> None:
        if self.writer is not None:
            self.writer.close()


class ProgressBar(Callback):
    """A tqdm bar for the rounds (``output.progress``), with the training loss and the latest test metric."""

    name = "progress_bar"

    def __init__(self):
        self.bar = None

    def on_run_start(self, exp) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=exp.cfg.training.rounds, initial=exp.round, desc=exp.cfg.algorithm.name, unit="round",
                        mininterval=1.0)  # fmt: skip

    def on_round_end(self, exp, record, diagnostics) -> None:
        post = {"loss": f"{diagnostics.get('train_loss', float('nan')):.4f}"}
        if "mAP" in record:
            head = next((k for k in record if k.startswith("P@")), "mAP")
            post[head] = f"{record[head]:.2f}"
            if record.get("W_mean_cos") is not None:
                post["cos(W)"] = f"{record['W_mean_cos']:.3f}"
        self.bar.set_postfix(post, refresh=False)  # drawn by update(), at most once a mininterval
        self.bar.update(1)

    def on_run_end(self, exp, status) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
