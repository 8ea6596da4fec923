"""What a run reports: ``metrics.jsonl`` (released) and ``private/diagnostics.jsonl`` (the operator's), one line
per round (:class:`MetricsFiles`), and at the end ``summary.json`` (released) and ``private/summary.json`` (the
operator's) (:class:`RunReport`).

``metrics.jsonl`` and ``summary.json`` hold only public facts, metrics of the released model on the test split,
and the privacy report; every statistic of private data goes to ``private/`` (tested key by key in
``tests/engine/test_released_files.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from secure_fed.engine.callbacks import Callback
from secure_fed.engine.evaluation import W_COSINE_WHY, evaluated, selection_metric, tagged_metric
from secure_fed.engine.privacy_report import aborted_charge, privacy_summary, tagged_report
from secure_fed.engine.run_context import RunContext
from secure_fed.release import NO_MECHANISM, protected, public, untagged_line
from secure_fed.run_files import METRICS_FILE, PRIVACY_RECORD, PRIVATE_DIR, SUMMARY_FILE

#: Keys of a ``metrics.jsonl`` line besides the evaluation metrics: public facts, and values computed from
#: the released model only. Everything else a round reports (losses, participant counts, clipping statistics,
#: regulariser values, protocol timings, and wall-clock time, which tracks how many clients trained) is a
#: statistic of private data and goes to ``private/diagnostics.jsonl``.
PUBLIC_ROUND_KEYS = ("round", "W_mean_cos", PRIVACY_RECORD)

__all__ = ["PRIVATE_DIR", "PUBLIC_ROUND_KEYS", "MetricsFiles", "RunReport", "evaluated", "private_summary", "summary"]


def rounds_to_target(history: list[dict[str, Any]], metric: str, value: float | None) -> int | None:
    """The first evaluated round whose ``metric`` reaches ``value`` (the FLAG paper's early-convergence measure,
    §5.2), from the released records only; None when no target is set or it is never reached. Its resolution is
    ``evaluation.every``."""
    if value is None:
        return None
    return next((int(h["round"]) for h in history if metric in h and h[metric] >= value), None)


#: why each of ``summary.json``'s fields may be released (:func:`secure_fed.release.public`)
CONFIG = "the run's config"
HARDWARE = "a fact of the hardware and the config (the machine the server runs on), not of the data"
ROUNDS = "rounds run: the loop's public count (a budget stop is the ledger's, from the config)"
ABORTS = ("rounds a protocol aborted: seen by every observer of the rounds (the ledger charges each like any other; "
          "summary.json's aborted_charge)")  # fmt: skip
STATUS = ("how the loop ended: completed, stopped by the ledger's budget (config), interrupted, or diverged (the "
          "released model became non-finite: a function of it)")  # fmt: skip
FEDERATION = "the federation's size: how many clients the config's partition makes of the dataset (a public fact)"
DROPPED = "labels the dataset's public preparation dropped (the label space is public: it decides W's shape)"
FROM_RELEASED = "read from the released metrics lines (their ledger's steps, their metrics): a post-processing of them"


def summary(ctx: RunContext, status: str) -> dict[str, Any]:
    """``summary.json``, tagged for the release gate (:mod:`secure_fed.release`): public facts, the released model's
    final test metrics and the privacy report."""
    rec, plan = ctx.records, ctx.plan
    last = next((h for h in reversed(rec.history) if evaluated(h)), {})
    final = {k: last[k] for k in last if k not in PUBLIC_ROUND_KEYS}
    cos = last.get("W_mean_cos")
    if rec.selected is not None:  # a centralised baseline reports the epoch it selected on validation
        final, cos = rec.selected["metrics"], rec.selected["W_mean_cos"]
    units = ctx.stack.accounting()
    out = {
        "algorithm": public(plan.algorithm.name, CONFIG),
        "dataset": public(ctx.dataset.name, "the dataset's public name"),
        "rounds_completed": public(rec.round, ROUNDS),
        "rounds_planned": public(plan.training.rounds, CONFIG),
        "rounds_aborted": public(rec.rounds_aborted, ABORTS),
        "status": public(status, STATUS),
        # a metric keeps its tag from the metrics lines: one that came there untagged stays untagged here
        "final": {
            k: v
            if untagged_line(METRICS_FILE, k) in rec.release_findings
            else tagged_metric(k, v, on_validation=plan.dataset.evaluate_on == "validation")
            for k, v in final.items()
        },
        "W_mean_cos": public(cos, W_COSINE_WHY),
        PRIVACY_RECORD: tagged_report(privacy_summary(units), units),
        "protocols": public(list(plan.protocols), CONFIG),
        "stop_reason": public(rec.stop_reason, f"why the loop stopped, if early: {STATUS}"),
        "device": public(str(ctx.device), HARDWARE),
        "executor": public(ctx.executor.name, HARDWARE),
        # the precision the clients trained in (training.precision resolved for the device: a fact of the hardware)
        "precision": public(plan.training.precision, HARDWARE),
        # torch's threads and OpenMP's wait policy (training.threads resolved for this machine: a fact of the hardware)
        "threads": public(rec.threads, HARDWARE),
        "num_clients": public(len(ctx.fed.clients), FEDERATION),
        "dropped_labels": public(ctx.dataset.meta.get("dropped_labels", []), DROPPED),
    }
    if charge := aborted_charge(rec.history, rec.diagnostics):
        out["aborted_charge"] = public(charge, FROM_RELEASED)
    ev = plan.evaluation
    if ev.target_value is not None:
        target = {"metric": ev.target_metric, "value": ev.target_value,
                  "rounds_to_target": rounds_to_target(rec.history, ev.target_metric, ev.target_value)}  # fmt: skip
        reported = sorted({k for h in rec.history for k in h if k not in ("round", PRIVACY_RECORD)})
        if reported and ev.target_metric not in reported:  # null would read as "never reached"
            target["note"] = (f"no evaluated round reports {ev.target_metric!r} (evaluation.target_metric); "
                              f"this run's metrics: {', '.join(reported)}")  # fmt: skip
        out["target"] = public(target, f"{CONFIG} (evaluation.target_*), and the round {FROM_RELEASED}")
    if rec.selected is not None:
        # selected on a validation split of the training data, with no mechanism (refused under DP: ε is ∞ already)
        out["selected_round"] = protected(rec.selected["round"], NO_MECHANISM)
        out["selection"] = public(f"{selection_metric(plan.evaluation)} on a validation split of the training data", CONFIG)
    return out


def private_summary(ctx: RunContext) -> dict[str, Any]:
    """Statistics of private data for the operator (``private/summary.json``): never released."""
    rec = ctx.records
    return {
        "wall_seconds": rec.wall_before,
        "seconds_per_round": rec.wall_before / max(rec.round, 1),
        "setup": rec.setup_facts,
        # training instances the public contribution bound changed (secure_fed.data.bounding)
        "bounded_instances": ctx.fed.bounded_instances,
        # counts of client updates: under secret (Poisson) client sampling the cohort sizes are private
        "executor": ctx.executor.report(),
        "protocols": ctx.stack.private_report(),
        "last_round": rec.diagnostics[-1] if rec.diagnostics else None,
    }


class MetricsFiles(Callback):
    """``metrics.jsonl`` (released) and ``private/diagnostics.jsonl`` (the operator's): one line per round,
    appended, flushed and fsync'd; a resumed run first truncates both to its checkpoint's rounds, and whatever
    stops the loop, the files are rewritten to match the records at the end."""

    name = "metrics_files"

    def _paths(self, ctx) -> tuple[Path, Path]:
        return ctx.run_dir / METRICS_FILE, ctx.run_dir / PRIVATE_DIR / "diagnostics.jsonl"

    def rewrite(self, ctx) -> None:
        """Both files exactly as the run's records are now (atomically)."""
        for path, recs in zip(self._paths(ctx), (ctx.records.history, ctx.records.diagnostics), strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".jsonl.tmp")
            with tmp.open("w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in recs)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(path)

    def on_run_start(self, ctx) -> None:
        self.rewrite(ctx)  # a resumed run: drop lines written after the checkpoint it resumed from

    def on_round_end(self, ctx, record, diagnostics) -> None:
        for path, rec in zip(self._paths(ctx), (record, diagnostics), strict=True):
            with path.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    def on_run_end(self, ctx, status) -> None:
        self.rewrite(ctx)  # whatever stopped the loop, the files match the records


class RunReport(Callback):
    """``summary.json`` and ``private/summary.json`` at the release (after the final checkpoint); keeps both for the
    run's :class:`~secure_fed.engine.runner.RunResult`."""

    name = "run_report"

    def __init__(self):
        self.summary: dict[str, Any] = {}
        self.private: dict[str, Any] = {}

    def on_release(self, ctx, status) -> None:
        """Through the release gate (``records.release``): a field :func:`summary` left untagged, or any finding of
        the run's other released files, makes the summary's ε ∞ with its one-line why."""
        self.summary = ctx.records.release(summary(ctx, status), SUMMARY_FILE)
        self.private = private_summary(ctx)
        (ctx.run_dir / SUMMARY_FILE).write_text(json.dumps(self.summary, indent=2))
        (ctx.run_dir / PRIVATE_DIR).mkdir(exist_ok=True)
        (ctx.run_dir / PRIVATE_DIR / "summary.json").write_text(json.dumps(self.private, indent=2, default=str))

    def on_cli_run_end(self, ctx, result) -> None:
        """``secure-fed run`` (and :func:`secure_fed.run`) leave the run's plots beside its files: ``report.png``
        (the metrics against the round, its ε in the legend), drawn from the released files only; quietly (the
        Python API prints nothing)."""
        from secure_fed.report import report
        from secure_fed.run_history import load_run

        if load_run(ctx.run_dir)[0]:  # an evaluated round to draw
            report([ctx.run_dir], out=ctx.run_dir / "report.png", table=False)
