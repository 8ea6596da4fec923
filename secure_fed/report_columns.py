"""The columns of a report's table, in groups: setup, privacy, utility, attacks; and how ε is written (``4.0``, ``∞``).

Used by the console table of ``secure-fed report``, the HTML page (a header row per group) and ``results.csv``
(the same order)."""

from __future__ import annotations

import math
from typing import Any

from secure_fed.run_files import ATTACKS_RECORD, OPERATOR_PREFIX, PRIVACY_RECORD

SETUP = ("run", "method", "seed", "status", "rounds")
PRIVACY = ("unit", "target_epsilon", "epsilon", "delta", "sigma", "accountant", "adversaries")
#: columns that hold an ε (written with :func:`format_epsilon`)
EPSILON_COLUMNS = ("target_epsilon", "epsilon")
HIDDEN = ("run_dir",)


def format_epsilon(v: Any) -> str:
    """ε as a reader wants it: ``∞`` without DP, one decimal from 1 on (``4.0`` for 3.998), two significant digits
    below (``0.52``); ``?`` when unknown."""
    if isinstance(v, str):
        if v == "inf":
            return "∞"
        try:
            v = float(v)
        except ValueError:
            return v
    if v is None or not isinstance(v, (int, float)) or math.isnan(v):
        return "?"
    if math.isinf(v):
        return "∞"
    return f"{v:.1f}" if round(v, 2) >= 1 else f"{v:.2g}"


def epsilon_label(released: Any, target: Any = None) -> str:
    """The released model's ε as a plot's legend writes it, in ``report.png`` and ``report.html`` alike: ``4.0`` (the
    run's target and what it released agree as written), ``1.8 (target 2.0)`` when they differ, ``∞ (unit target
    2.0)`` when a DP unit's target covers only part of the run (the released model's ε is ∞); the target when the
    released ε is not known yet (``?``: a run without a ledger line)."""
    shown = format_epsilon(released)
    goal = format_epsilon(target) if target is not None else "?"
    if goal in ("?", shown):
        return shown
    if shown == "?":
        return goal
    return f"∞ (unit target {goal})" if shown == "∞" else f"{shown} (target {goal})"


def column_groups(rows: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """``(group, columns)`` for the rows: setup, privacy, utility (the metrics), attacks (``operator.…``, with their
    confidence intervals); a group none of the rows has is left out."""
    keys = {k for r in rows for k in r} - set(HIDDEN)
    setup = [c for c in SETUP if c in keys]
    privacy = [c for c in PRIVACY if c in keys]
    rest = sorted(keys - set(setup) - set(privacy))
    attacks = [k for k in rest if k.startswith(OPERATOR_PREFIX)]
    utility = [k for k in rest if k not in attacks]
    groups = [("setup", setup), (PRIVACY_RECORD, privacy), ("utility", utility), (ATTACKS_RECORD, attacks)]
    return [(g, cols) for g, cols in groups if cols]


def columns(rows: list[dict[str, Any]]) -> list[str]:
    return [c for _, cols in column_groups(rows) for c in cols]
