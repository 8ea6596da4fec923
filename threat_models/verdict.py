"""The audit's last lines: one verdict per attack, on a named primary score, the multiple comparisons accounted for.

A verdict reads the shape of an attack's scores, never its name. An attack that reports AUCs with 95% intervals
(membership inference: LOSS, LiRA online and offline, RMIA online and offline) is judged on each of them. Every AUC
judged in one audit is one comparison of the family: each interval is taken at
1 − α/m (Bonferroni, family level 1 − α), so "some score leaks" is claimed at the family's level however many
scores were tried. The attack records 95% percentile-bootstrap intervals; the Bonferroni interval is that
interval widened by a normal approximation (its half-widths × z(1 − α/2m) / z(0.975)).

An ε lower bound (``epsilon_lower_bound``, the one-run audit's) already holds at its configured confidence over the
guess counts it tried (Bonferroni inside the attack); it is judged as it stands. An attack without an interval on
its score gets no verdict, and the line says so.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

from secure_fed.plugin_api.attacks import attack_specs

#: the family's error rate: every verdict line holds together at 1 − FAMILY_ALPHA
FAMILY_ALPHA = 0.05
_Z95 = NormalDist().inv_cdf(0.975)


def bonferroni_interval(estimate: float, ci95: list[float], m: int, alpha: float = FAMILY_ALPHA) -> tuple[float, float]:
    """The 1 − α/m interval around ``estimate`` from its recorded 95% interval (each side's half-width scaled by
    z(1 − α/2m) / z(0.975): a normal approximation of the bootstrap distribution)."""
    scale = NormalDist().inv_cdf(1 - alpha / (2 * max(m, 1))) / _Z95
    lo, hi = ci95
    return estimate - (estimate - lo) * scale, estimate + (hi - estimate) * scale


def _auc_judgements(attacks: dict[str, Any]) -> list[tuple[str, str, dict]]:
    """(attack, score, its metrics) of every AUC with an interval in the audit: the family's comparisons."""
    out = []
    for name, entry in attacks.items():
        if "skipped" in entry:
            continue
        for score, m in entry.get("metrics", {}).items():
            if isinstance(m, dict) and "auc_ci95" in m:
                out.append((name, score, m))
    return out


def _label(name: str, score: str) -> str:
    """The name attack ``name`` gives its score ``score`` (its spec's ``score_labels``), else the key."""
    spec = attack_specs().get(name)
    return spec.score_labels.get(score, score) if spec is not None else score


def _auc_line(name: str, judged: list[tuple[str, dict]], m: int, alpha: float) -> str:
    level = f"primary score: AUC; Bonferroni over the audit's {m} AUC{'s' if m != 1 else ''}, each at {1 - alpha / m:.2%}"
    rows = []
    for score, met in judged:
        lo, hi = bonferroni_interval(met["auc"], met["auc_ci95"], m, alpha)
        rows.append((lo, hi, score, met))
    leaking = [r for r in rows if r[0] > 0.5]
    if leaking:
        lo, hi, score, met = max(leaking, key=lambda r: r[0])
        tpr = met.get("tpr_at_1pct_fpr")
        more = f"; TPR at 1% FPR {tpr:.3f}" if tpr is not None else ""
        others = f" ({len(leaking)} of {len(rows)} scores above 0.5)" if len(rows) > 1 else ""
        return (f"{name}: leak: {_label(name, score)} AUC {met['auc']:.3f} [{lo:.3f}, {hi:.3f}] "
                f"lies above 0.5{others}{more} ({level})")  # fmt: skip
    lo, hi, score, met = max(rows, key=lambda r: r[3]["auc"])
    every = "every AUC interval contains 0.5" if all(r[0] <= 0.5 <= r[1] for r in rows) else "no AUC interval lies above 0.5"
    return (f"{name}: no leakage measurable at this power: {every}; the highest, "
            f"{_label(name, score)} AUC {met['auc']:.3f} [{lo:.3f}, {hi:.3f}] ({level})")  # fmt: skip


def _lower_bound_line(name: str, entry: dict) -> str:
    m = entry["metrics"]
    conf = entry.get("details", {}).get("confidence", 0.95)
    lb = float(m["epsilon_lower_bound"])
    how = f"primary score: the ε lower bound at {conf:.0%} confidence, Bonferroni over its guess counts inside the attack"
    if lb > 0:
        return f"{name}: leak: ε ≥ {lb:.3f} (the model reveals whether canaries were inserted; {how})"
    return f"{name}: no leakage measurable at this power: the ε lower bound is 0 ({how})"


def verdict_lines(attacks: dict[str, Any], names: list[str] | None = None, alpha: float = FAMILY_ALPHA) -> list[str]:
    """One line per attack of ``names`` (default: all in ``attacks``, an ``attacks.json``'s record) that ran."""
    names = list(attacks) if names is None else [n for n in names if n in attacks]
    aucs = _auc_judgements({n: attacks[n] for n in names})
    lines = []
    for name in names:
        entry = attacks[name]
        if "skipped" in entry:
            continue
        judged = [(s, m) for a, s, m in aucs if a == name]
        if judged:
            lines.append(_auc_line(name, judged, len(aucs), alpha))
        elif "epsilon_lower_bound" in entry.get("metrics", {}):
            lines.append(_lower_bound_line(name, entry))
        else:
            lines.append(f"{name}: no verdict: it reports its rates beside chance, with no interval to judge them by")
    return lines
