"""The Python API: load a config and run an experiment from Python, as ``secure-fed run`` does from the shell.

    import secure_fed
    result = secure_fed.run({"algorithm": {"name": "fedavg"}, "training": {"rounds": 2}})
    result.metrics["P@1"], result.privacy["epsilon"], result.run_dir

``config`` is a YAML path, a mapping (read as the YAML document it stands for), a run plan
(:func:`secure_fed.config.load_plan`, :func:`~secure_fed.config.build_plan`), a loaded config, or None for the
embedded default; the config package turns it into the run's plan once (:func:`load_plan`), which the run reads.
A bad config raises :class:`~secure_fed.errors.ConfigError` with the one line the CLI prints.
``callbacks`` are :class:`~secure_fed.engine.callbacks.Callback` objects run with the built-in ones: each hook gets
the run's :class:`~secure_fed.engine.run_context.RunContext` (``on_round_end(ctx, record, diagnostics)``: the
round's released record and its private diagnostics).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from secure_fed.engine.runner import RunResult
    from secure_fed.plan import RunPlan


def default_run_dir(plan: RunPlan) -> Path:
    """``output.dir``/``output.name``, or ``output.dir``/ALGORITHM-DATASET-TIMESTAMP when the config names none."""
    name = plan.output.name or f"{plan.algorithm.name}-{plan.dataset.name or 'data'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(plan.output.dir) / name


def run(
    config: str | Path | Mapping[str, Any] | Any = None,
    *,
    overrides: Sequence[str] = (),
    callbacks: Sequence[Any] = (),
    run_dir: str | Path | None = None,
    data_root: str | None = None,
    progress: bool = False,
) -> RunResult:
    """Train ``config`` to its end and write its run directory; returns the result (``metrics``, ``privacy``,
    ``status``, ``summary``, ``history``, ``run_dir``). ``run_dir`` defaults to :func:`default_run_dir`; one that
    already holds a run is refused (``secure-fed resume RUN_DIR`` continues it). As after ``secure-fed run``, the
    registered callbacks then finish their work (e.g. the configured attacks of ``threat_models``)."""
    from secure_fed.config import load_plan
    from secure_fed.errors import SecureFedError
    from secure_fed.run_files import holds_checkpoint

    plan = load_plan(config, list(overrides))
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(plan)
    if holds_checkpoint(run_dir):
        raise SecureFedError(
            f"{run_dir} already holds a run; continue it with secure-fed resume {run_dir}, or give another run_dir"
        )
    from secure_fed.engine import Experiment

    exp = Experiment(plan, run_dir=run_dir, data_root=data_root, callbacks=list(callbacks))
    result = exp.run(progress=progress)
    if result.status != "interrupted":  # an interrupted run is resumed, not audited
        for cb in exp.callbacks:
            cb.on_cli_run_end(exp.context(), result)
    return result
