"""What an audit will cost, said before it starts: the training its attacks add (each attack's spec's ``cost``, e.g.
membership inference's shadow runs) and a time estimate.

The estimate is the run's own pace (``seconds_per_round`` in its operator-only ``private/summary.json``: the
wall-clock time of its rounds, evaluations included) times the rounds the attacks train (for shadow runs: shadows ×
the run's rounds, less the shadows cached from an earlier audit), times :data:`SHADOW_ROUND_FACTOR`, plus
:data:`OVERHEAD_S`. Both constants were measured on the embedded default run (synthetic data, 60 rounds, one
torch thread) audited with 4 and 16 shadows; the estimate was within 2× of the actual time at both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from secure_fed.plugin_api.attacks import PRIVATE_DIR, attack_specs
from threat_models.attacks_section import attack_settings, attacks_of

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan

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


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate(run_dir: Path, plan: RunPlan, names: list[str]) -> tuple[str, float | None]:
    """The headline an audit of the run ``plan`` describes prints first, and its time estimate in seconds (None when
    it cannot be made)."""
    pace = _seconds_per_round(run_dir)
    specs = attack_specs()
    section = attacks_of(plan)
    parts, shadow_rounds, hints = [], 0, []
    for name in names:
        spec = specs.get(name)
        if spec is not None and spec.cost is not None:
            words, rounds, hint = spec.cost(attack_settings(section, name), plan, run_dir)
            parts.append(words)
            shadow_rounds += rounds
            hints += [hint] if hint else []
    what = "; ".join(parts) or "no shadow runs"
    if pace is None:
        return f"audit of {run_dir}: {len(names)} attack(s); {what}; no time estimate (no private/summary.json pace)", None
    seconds = shadow_rounds * pace * SHADOW_ROUND_FACTOR + OVERHEAD_S
    how = (f"{shadow_rounds:,} × the run's {pace:.2f} s/round × {SHADOW_ROUND_FACTOR:g} + {OVERHEAD_S:.0f} s"
           if shadow_rounds else "rebuilding the run and scoring")  # fmt: skip
    fewer = f" (fewer: {'; '.join(hints)})" if hints else ""
    return (f"audit of {run_dir}: {len(names)} attack(s); {what}; estimated {_duration(seconds)} ({how}){fewer}",
            seconds)  # fmt: skip
