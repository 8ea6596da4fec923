"""The privacy report, from the protocol stack's per-unit ledger: ε and δ now (on every metrics line), the
summary's report, and what the ledger charged for aborted rounds. Functions of public facts and of the DP
ledger only; :func:`tagged_report` tags one for a release writer (:mod:`secure_fed.release`)."""

from __future__ import annotations

from typing import Any

from secure_fed.release import Released, protected, public
from secure_fed.run_files import PRIVACY_RECORD

#: why the privacy report may be released: what the accountant computes from the config and the declared mechanisms
LEDGER_WHY = ("the privacy ledger: ε and δ the accountant computes from the config (σ, q, C, δ, public bounds) and the "
              "public count of steps, and notes naming settings")  # fmt: skip
#: the DP mechanism (its registered kind, and the report's key) whose outputs the report carries: adaptive clipping's
#: clip norm C_t, a function of noisy counts (Andrew et al. 2021)
ADAPTIVE_CLIPPING = "adaptive_clipping"
#: what an adaptive-clipping unit's report holds of its mechanism's outputs: C_t now, each round's, and the next
ADAPTIVE_OUTPUTS = ("clip_norm", "clip_norm_by_round", "next_clip_norm")


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
        if ADAPTIVE_CLIPPING in u:  # a clip norm that changes each round, from DP-protected values: released
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


def _tagged_unit(name: str, entry: dict[str, Any], units: dict[str, dict[str, Any]]) -> dict[str, Released]:
    """A unit's entry of a report, each key tagged: adaptive clipping's C_t (every :data:`ADAPTIVE_OUTPUTS` key, at
    the entry's top or in its ``adaptive_clipping`` part) is that mechanism's output; the rest is the ledger's."""
    adaptive = ADAPTIVE_CLIPPING in units.get(name, {})

    def tag(key: str, value: Any) -> Released:
        return protected(value, ADAPTIVE_CLIPPING) if adaptive and key in ADAPTIVE_OUTPUTS else public(value, LEDGER_WHY)

    out = {k: tag(k, v) for k, v in entry.items()}
    if adaptive and isinstance(entry.get(ADAPTIVE_CLIPPING), dict):
        out[ADAPTIVE_CLIPPING] = {k: tag(k, v) for k, v in entry[ADAPTIVE_CLIPPING].items()}  # type: ignore[assignment]
    return out


def tagged_report(report: dict[str, Any], units: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``report`` (:func:`privacy_now`'s or :func:`privacy_summary`'s, from ``units``) with every key tagged for a
    release writer: the ledger's values public (:data:`LEDGER_WHY`), adaptive clipping's C_t protected by its
    mechanism."""
    out: dict[str, Any] = {}
    for key, value in report.items():
        if key == "units":
            out[key] = {name: _tagged_unit(name, u, units) for name, u in value.items()}
        elif key in units and isinstance(value, dict):  # a metrics line's per-unit entry
            out[key] = _tagged_unit(key, value, units)
        else:
            out[key] = public(value, LEDGER_WHY)
    return out
