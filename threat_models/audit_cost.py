"""What an audit will cost, said before it starts: the shadow runs it trains and a time estimate.

The estimate is the run's own pace (``seconds_per_round`` in its operator-only ``private/summary.json``: the
wall-clock time of its rounds, evaluations included) times the shadow rounds to train (shadows × the run's
rounds, less the shadows cached from an earlier audit), times :data:`SHADOW_ROUND_FACTOR`, plus
:data:`OVERHEAD_S`. Both constants were measured on the embedded default run (synthetic data, 60 rounds, one
torch thread) audited with 4 and 16 shadows; the estimate was within 2× of the actual time at both.
"""

from __future__ import annotations

import json
from pathlib import Path

from secure_fed.run_files import PRIVATE_DIR

#: a shadow round against a round of the audited run: shadows train on a random half of the target pool (training
#: and test rows together), evaluate once on 16 rows, and train together as one vectorised cohort
SHADOW_ROUND_FACTOR = 0.5
#: seconds outside the shadows' rounds: the run rebuilt from its checkpoint, the shadows built, the scores computed
OVERHEAD_S = 15.0


def _seconds_per_round(run_dir: Path) -> float | None:
    try:
        doc = json.loads((run_dir / PRIVATE_DIR / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    value = doc.get("seconds_per_round")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _cached_shadows(run_dir: Path, shadow_dir: str | None, shadows: int) -> int:
    """Shadows an earlier audit left in the cache (the most of any one recipe's folder there)."""
    root = Path(shadow_dir) if shadow_dir else run_dir / "shadows"
    if not root.is_dir():
        return 0
    counts = [sum((d / f"shadow{k}.npz").is_file() for k in range(shadows)) for d in root.iterdir() if d.is_dir()]
    return max(counts, default=0)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate(run_dir: Path, cfg, names: list[str]) -> tuple[str, float | None]:
    """The headline an audit prints first, and its time estimate in seconds (None when it cannot be made)."""
    rounds = cfg.training.rounds
    pace = _seconds_per_round(run_dir)
    parts, shadow_rounds, k = [], 0, 0
    if "membership_inference" in names:
        opts = cfg.attacks.membership_inference
        k = opts.shadows
        cached = _cached_shadows(run_dir, opts.shadow_dir, k) if k else 0
        shadow_rounds = (k - cached) * rounds
        if k:
            reuse = f", {cached} cached from an earlier audit" if cached else ""
            parts.append(f"membership_inference trains {k - cached} shadow run{'s' if k - cached != 1 else ''} × "
                         f"{rounds} rounds = {shadow_rounds:,} shadow rounds{reuse}")  # fmt: skip
        else:
            parts.append("membership_inference: LOSS only (attacks.membership_inference.shadows=0)")
    what = "; ".join(parts) or "no shadow runs"
    if pace is None:
        return f"audit of {run_dir}: {len(names)} attack(s); {what}; no time estimate (no private/summary.json pace)", None
    seconds = shadow_rounds * pace * SHADOW_ROUND_FACTOR + OVERHEAD_S
    how = (f"{shadow_rounds:,} × the run's {pace:.2f} s/round × {SHADOW_ROUND_FACTOR:g} + {OVERHEAD_S:.0f} s"
           if shadow_rounds else "rebuilding the run and scoring")  # fmt: skip
    fewer = " (fewer: --set attacks.membership_inference.shadows=4)" if shadow_rounds and k > 4 else ""
    return (f"audit of {run_dir}: {len(names)} attack(s); {what}; estimated {_duration(seconds)} ({how}){fewer}",
            seconds)  # fmt: skip
