"""Whether runs compare: the setup facts (``config.yaml``) in which runs differ beyond ε and seed.

A report that draws runs side by side says, by drawing them, that they differ only in what it varies: the
privacy target ε (σ follows from it) and the seed, with one line per method. :func:`setup_differences` names every
other setting that differs (``training.rounds: 10 in A, 20 in B``), so that ``secure-fed report`` refuses, or, asked
to, draws them under a warning. What it leaves out of the comparison:

* ``seed`` and ``privacy.noise_seed`` (the seeds), and each privacy block's ``target_epsilon`` and
  ``noise_multiplier`` (ε, and the σ calibrated to it);
* the ``dp`` layer and the ``privacy`` section between a run with DP and one without (ε = ∞): among the runs with DP,
  every other privacy setting (the unit, δ, the accountant, clipping, sampling) must match;
* ``algorithm.*`` between runs of different methods (each method is its own line); within a method it must match;
* where and how a run executes, not what it computes: ``device``, ``output``, ``backend``, ``flower``,
  ``training.executor``, ``training.chunk_clients``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from secure_fed.errors import SecureFedError

#: dotted keys (and key prefixes) never compared: where a run executes; nor is any seed (a key named ``seed`` or
#: ``*_seed``: the run's seed, and secret ones such as a DP noise seed, whose values a report must never print)
IGNORED = ("device", "output", "backend", "flower", "training.executor", "training.chunk_clients")
#: the privacy block settings that ε sets (σ is calibrated to the target ε)
SWEPT_PRIVACY = ("target_epsilon", "noise_multiplier")


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _ignored(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return last == "seed" or last.endswith("_seed") or any(key == p or key.startswith(p + ".") for p in IGNORED)


def comparable_setup(cfg: dict[str, Any]) -> dict[str, Any]:
    """The run's settings as dotted keys, without what a report may vary (ε, the seeds, the dp layer) and where it ran."""
    flat = {k: v for k, v in _flatten(cfg).items() if not _ignored(k)}
    protocols = list(cfg.get("protocols") or [])
    flat["protocols"] = [p for p in protocols if p != "dp"]
    dp = "dp" in protocols
    for key in [k for k in flat if k.startswith("privacy.")]:
        if not dp or key.rsplit(".", 1)[-1] in SWEPT_PRIVACY:
            del flat[key]
    return flat


def read_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        raise SecureFedError(f"{path}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise SecureFedError(f"{path}: not a config (a YAML mapping of sections)")
    return doc


def _show(v: Any) -> str:
    return "unset" if v is None else (", ".join(map(str, v)) if isinstance(v, list) else str(v))


def setting(run_dir: Path, key: str) -> str:
    """The value of one dotted setting in the run's ``config.yaml``, as text (``unset`` when absent)."""
    return _show(_flatten(read_config(run_dir) or {}).get(key))


def setup_differences(run_dirs: list[Path], *, vary: tuple[str, ...] = ()) -> list[str]:
    """One phrase per setting in which the runs differ beyond ε and seed (``"training.rounds: 10 in a, 20 in b"``);
    empty when they compare (or there is one run). ``vary``: settings (dotted keys, or a section) that the report
    sweeps as well, left out. A run without ``config.yaml`` cannot be compared: it is named."""
    if len(run_dirs) < 2:
        return []
    cfgs = {d: read_config(d) for d in run_dirs}
    missing = [d.name for d, c in cfgs.items() if c is None]
    if missing:
        return [f"no config.yaml in {', '.join(missing)} (its setup is unknown)"]
    setups = {d: comparable_setup(c) for d, c in cfgs.items()}
    method = {d: (c.get("algorithm") or {}).get("name") for d, c in cfgs.items()}
    out = []
    for key in sorted({k for s in setups.values() for k in s}):
        if any(key == v or key.startswith(v + ".") for v in vary):
            continue
        if key.startswith("algorithm."):  # compared within a method only: each method is its own line
            groups = [[d for d in run_dirs if method[d] == m] for m in dict.fromkeys(method.values())]
        elif key.startswith("privacy."):  # compared among the runs with DP only (a run without it is ε = ∞)
            groups = [[d for d in run_dirs if "dp" in (cfgs[d].get("protocols") or [])]]
        else:
            groups = [run_dirs]
        for group in groups:
            values = {d: setups[d].get(key) for d in group}
            if len({repr(v) for v in values.values()}) > 1:
                firsts = {}
                for d, v in values.items():
                    firsts.setdefault(repr(v), (v, d))
                out.append(f"{key}: " + ", ".join(f"{_show(v)} in {d.name}" for v, d in firsts.values()))
                break
    return out


def mixed_runs_message(diffs: list[str], *, limit: int = 3) -> str:
    """The one line that says the runs do not compare."""
    more = f"; and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return "the runs differ in more than ε and seed: " + "; ".join(diffs[:limit]) + more
