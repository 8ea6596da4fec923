"""The Python API: load a config and run an experiment from Python, as ``secure-fed run`` does from the shell.

    import secure_fed
    result = secure_fed.run({"algorithm": {"name": "fedavg"}, "training": {"rounds": 2}})
    result.metrics["P@1"], result.privacy["epsilon"], result.run_dir

``config`` is a YAML path, a mapping (read as the YAML document it stands for), a loaded config, or None for the
embedded default. A bad config raises :class:`~secure_fed.errors.ConfigError` with the one line the CLI prints.
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


def load_config(config: str | Path | Mapping[str, Any] | Any = None, overrides: Sequence[str] = ()) -> Any:
    """The validated config of ``config`` (a path, a mapping, a loaded config or None: the embedded default) with
    ``overrides`` (``"key=value"`` strings, as ``--set``) applied."""
    from secure_fed.config import load_config as load
    from secure_fed.config.schema import CoreConfig

    if isinstance(config, CoreConfig):
        if not overrides:
            return config
        config = config.model_dump(mode="json")
    return load(config, list(overrides))


def default_run_dir(cfg: Any) -> Path:
    """``output.dir``/``output.name``, or ``output.dir``/ALGORITHM-DATASET-TIMESTAMP when the config names none."""
    name = cfg.output.name or f"{cfg.algorithm.name}-{cfg.dataset.name or 'data'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output.dir) / name


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
    from secure_fed.errors import SecureFedError
    from secure_fed.run_files import holds_checkpoint

    cfg = load_config(config, overrides)
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(cfg)
    if holds_checkpoint(run_dir):
        raise SecureFedError(
            f"{run_dir} already holds a run; continue it with secure-fed resume {run_dir}, or give another run_dir"
        )
    from secure_fed.engine import Experiment

    exp = Experiment(cfg, run_dir=run_dir, data_root=data_root, callbacks=list(callbacks))
    result = exp.run(progress=progress)
    if result.status != "interrupted":  # an interrupted run is resumed, not audited
        for cb in exp.callbacks:
            cb.on_cli_run_end(exp.context(), result)
    return result
