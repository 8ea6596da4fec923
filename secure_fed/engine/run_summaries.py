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

from secure_fed.config.choices import precision_choice
from secure_fed.engine.callbacks import Callback
from secure_fed.engine.evaluation import evaluated, selection_metric
from secure_fed.engine.privacy_report import aborted_charge, privacy_summary
from secure_fed.engine.run_context import RunContext
from secure_fed.run_files import PRIVACY_RECORD, PRIVATE_DIR

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


def summary(ctx: RunContext, status: str) -> dict[str, Any]:
    """``summary.json``: public facts, the released model's final test metrics and the privacy report."""
    rec, cfg = ctx.records, ctx.cfg
    last = next((h for h in reversed(rec.history) if evaluated(h)), {})
    final = {k: last[k] for k in last if k not in PUBLIC_ROUND_KEYS}
    cos = last.get("W_mean_cos")
    if rec.selected is not None:  # a centralised baseline reports the epoch it selected on validation
        final, cos = rec.selected["metrics"], rec.selected["W_mean_cos"]
    out = {
        "algorithm": cfg.algorithm.name,
        "dataset": ctx.dataset.name,
        "rounds_completed": rec.round,
        "rounds_planned": cfg.training.rounds,
        "rounds_aborted": rec.rounds_aborted,
        "status": status,
        "final": final,
        "W_mean_cos": cos,
        PRIVACY_RECORD: privacy_summary(ctx.stack.accounting()),
        "protocols": list(cfg.protocols),
        "stop_reason": rec.stop_reason,
        "device": str(ctx.device),
        "executor": ctx.executor.name,
        # the precision the clients trained in (training.precision resolved for the device: a fact of the hardware)
        "precision": precision_choice(cfg, ctx.dataset, ctx.device.type),
        # torch's threads and OpenMP's wait policy (training.threads resolved for this machine: a fact of the hardware)
        "threads": rec.threads,
        "num_clients": len(ctx.fed.clients),
        "dropped_labels": ctx.dataset.meta.get("dropped_labels", []),
    }
    if charge := aborted_charge(rec.history, rec.diagnostics):
        out["aborted_charge"] = charge
    ev = cfg.evaluation
    if ev.target_value is not None:
        out["target"] = {"metric": ev.target_metric, "value": ev.target_value,
                         "rounds_to_target": rounds_to_target(rec.history, ev.target_metric, ev.target_value)}  # fmt: skip
        reported = sorted({k for h in rec.history for k in h if k not in ("round", PRIVACY_RECORD)})
        if reported and ev.target_metric not in reported:  # null would read as "never reached"
            out["target"]["note"] = (f"no evaluated round reports {ev.target_metric!r} (evaluation.target_metric); "
                                     f"this run's metrics: {', '.join(reported)}")  # fmt: skip
    if rec.selected is not None:
        out["selected_round"] = rec.selected["round"]
        out["selection"] = f"{selection_metric(cfg)} on a validation split of the training data"
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
        return ctx.run_dir / "metrics.jsonl", ctx.run_dir / PRIVATE_DIR / "diagnostics.jsonl"

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
        self.summary, self.private = summary(ctx, status), private_summary(ctx)
        (ctx.run_dir / "summary.json").write_text(json.dumps(self.summary, indent=2))
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
