"""Cached, resumable runs for sweeps: the one implementation the CLI and the experiment scripts share.

A run directory is reused only for the same resolved config: ``RUN_DIR/private/config.yaml`` must equal the
new plan's config (:attr:`~secure_fed.plan.RunPlan.config_yaml`), both read through the config package (every key;
``output.progress`` aside, which changes nothing but the terminal; keys added since the run was recorded take their defaults). A
finished run is returned as is; an unfinished one resumes from its checkpoint; a directory holding a
run of another config is an error naming the first key that differs, never a silent reuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from secure_fed.config import first_difference
from secure_fed.errors import SecureFedError
from secure_fed.run_status import TRAINED

if TYPE_CHECKING:
    from secure_fed.plan import RunPlan

#: statuses after which a run is not resumed by a sweep (failed and diverged runs would only repeat the failure)
FINISHED = (*TRAINED, "failed", "diverged")
_IGNORED = {("output", "progress")}


def _comparable(doc: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    for section, key in _IGNORED:
        if isinstance(out.get(section), dict):
            out[section].pop(key, None)
    return out


def cached_summary(plan: RunPlan, run_dir: str | Path) -> dict[str, Any] | None:
    """The summary of a finished run of exactly ``plan`` in ``run_dir``; None if there is none yet.

    Raises :class:`SecureFedError` when ``run_dir`` holds a run of another config."""
    from secure_fed.run_files import operator_config_path

    run_dir = Path(run_dir)
    saved = operator_config_path(run_dir)  # the whole config: the released one lacks the secret settings
    if not saved.is_file():
        if (run_dir / "config.yaml").is_file():
            raise SecureFedError(f"{run_dir} holds a run without its {saved} (the operator's config); use another output")
        return None
    from secure_fed.config import load_plan
    from secure_fed.errors import ConfigError

    try:  # through the schema, so that keys added since the run was recorded take their defaults
        recorded = load_plan(saved)
    except ConfigError as exc:
        raise SecureFedError(f"{run_dir} holds a run whose config no longer loads ({exc}); use another output") from None
    old, new = _comparable(yaml.safe_load(recorded.config_yaml)), _comparable(yaml.safe_load(plan.config_yaml))
    if old != new:
        raise SecureFedError(f"{run_dir} holds a run of another config ({first_difference(old, new)}); use another output")
    done = run_dir / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        if summary.get("status") in FINISHED:
            return summary
    return None


def run_cached(plan: RunPlan, run_dir: str | Path, *, data_root: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Run ``plan`` in ``run_dir`` unless a finished run of the same config is there; resume an unfinished one."""
    from secure_fed.engine import Experiment

    summary = cached_summary(plan, run_dir)
    if summary is not None:
        return summary
    exp = Experiment(plan, run_dir=run_dir, data_root=data_root)
    exp.resume()
    return exp.run(progress=progress).summary
