"""The privacy report, from the protocol stack's per-unit ledger: ε and δ now (on every metrics line), the
summary's report, and what the ledger charged for aborted rounds. Functions of public facts and of the DP
ledger only."""

from __future__ import annotations

from typing import Any

from secure_fed.run_files import PRIVACY_RECORD


def unnoised_why(units: dict[str, dict[str, Any]]) -> str | None:
    """One line naming the steps that shape a released tensor with no DP mechanism on them, from the structured
    ``unnoised`` list the DP layer reports in each unit (``{"step", "released", "why"}``); None when there is none."""
    seen: dict[str, dict[str, Any]] = {}
    for u in units.values():
        for x in u.get("unnoised") or []:
            seen.setdefault(x["step"], x)
    if not seen:
        return None
    released = sorted({t for x in seen.values() for t in x["released"]}, key=["theta", "W"].index)
    return f"no ε bounds the released {' and '.join(released)}: " + "; ".join(x["why"] for x in seen.values())


def privacy_now(units: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """ε and δ now from the stack's ``units`` (``ProtocolStack.accounting()``): per DP unit, plus the primary unit's
    values at the top (ε = ∞ without DP). The top-level ε is also ∞ when a step that shapes a released tensor has no
    DP mechanism on it (:func:`unnoised_why`); ``why`` then says which, on one line, and the units keep their own ε
    for what they do cover."""
    if not units:
        return {"epsilon": "inf", "delta": None}
    primary = next(iter(units))  # the layers report their primary unit first
    # the released model's ε: the observer's, which composes every mechanism the release reaches (a unit's own ledger
    # may leave out another unit's mechanism that also covers it, e.g. client-level noise per instance)
    observer = (units[primary].get("adversaries") or {}).get("observer") or {}
    eps = observer.get("epsilon", units[primary]["epsilon"])
    out: dict[str, Any] = {"epsilon": eps, "delta": units[primary]["delta"], "unit": primary}
    if why := unnoised_why(units):
        out["epsilon"], out["why"] = "inf", why
    for name, u in units.items():
        out[name] = {"epsilon": u["epsilon"], "delta": u["delta"], "steps": u["steps"]}
        if "adaptive_clipping" in u:  # a clip norm that changes each round, from DP-protected values: released
            out[name]["clip_norm"] = u["clip_norm"]
    return out


def privacy_summary(units: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``'s privacy report from the stack's ``units``."""
    if not units:
        return {"epsilon": "inf", "delta": None, "note": "no differential privacy mechanism in this run"}
    now = privacy_now(units)
    out = {"epsilon": now["epsilon"], "delta": now["delta"], "unit": now["unit"], "units": units}
    if "why" in now:
        out["why"] = now["why"]
    warnings = sorted({u["warning"] for u in units.values() if "warning" in u})
    if warnings:
        out["warning"] = "; ".join(warnings)
    return out


def aborted_charge(history: list[dict[str, Any]], diagnostics: list[dict[str, Any]]) -> dict[str, dict[str, int]] | None:
    """What the privacy ledger charged for the rounds a protocol aborted, per DP unit: ``{"steps": n, "of": total}``
    (an aborted round's cohort trained and the abort is observable, so it is charged like any other). Read from
    the released per-round ledger (each metrics line's steps) at the aborted rounds; None when no round aborted
    or no DP unit charged anything for them."""
    aborted = {d["round"] for d in diagnostics if "aborted" in d}
    if not aborted:
        return None
    before: dict[str, int] = {}
    charged: dict[str, int] = {}
    for rec in history:
        for name, u in (rec.get(PRIVACY_RECORD) or {}).items():
            if not (isinstance(u, dict) and "steps" in u):
                continue
            if rec["round"] in aborted:
                charged[name] = charged.get(name, 0) + u["steps"] - before.get(name, 0)
            before[name] = u["steps"]
    out = {name: {"steps": n, "of": before[name]} for name, n in charged.items() if n}
    return out or None
