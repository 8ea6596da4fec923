"""What a run reports: ``privacy`` on every metrics line, ``summary.json`` (released) and ``private/summary.json``
(the operator's), mixed into :class:`~secure_fed.engine.Experiment`.

``metrics.jsonl`` and ``summary.json`` hold only public facts, metrics of the released model on the test split,
and the privacy report; every statistic of private data goes to ``private/`` (tested key by key in
``tests/engine/test_released_files.py``).
"""

from __future__ import annotations

from typing import Any

from secure_fed.run_files import PRIVATE_DIR  # noqa: F401 - re-exported: the engine writes private/ files

#: Keys of a ``metrics.jsonl`` line besides the evaluation metrics: public facts, and values computed from
#: the released model only. Everything else a round reports (losses, participant counts, clipping statistics,
#: regulariser values, protocol timings, and wall-clock time, which tracks how many clients trained) is a
#: statistic of private data and goes to ``private/diagnostics.jsonl``.
PUBLIC_ROUND_KEYS = ("round", "W_mean_cos", "privacy")


def evaluated(record: dict[str, Any]) -> bool:
    """Whether a metrics line is an evaluated round (``mAP`` is computed at every evaluation, whatever the ks;
    ``AmAP`` alone for an algorithm without a global model)."""
    return "mAP" in record or "AmAP" in record


def rounds_to_target(history: list[dict[str, Any]], metric: str, value: float | None) -> int | None:
    """The first evaluated round whose ``metric`` reaches ``value`` (the FLAG paper's early-convergence measure,
    §5.2), from the released records only; None when no target is set or it is never reached. Its resolution is
    ``evaluation.every``."""
    if value is None:
        return None
    return next((int(h["round"]) for h in history if metric in h and h[metric] >= value), None)


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


class ReportMixin:
    def privacy_now(self) -> dict[str, Any]:
        """ε and δ now: per DP unit, plus the primary unit's values at the top (ε = ∞ without DP). The top-level ε is
        also ∞ when a step that shapes a released tensor has no DP mechanism on it (:func:`unnoised_why`); ``why``
        then says which, on one line, and the units keep their own ε for what they do cover."""
        units = self.stack.privacy()
        if not units:
            return {"epsilon": "inf", "delta": None}
        primary = next(iter(units))  # the layers report their primary unit first
        out: dict[str, Any] = {"epsilon": units[primary]["epsilon"], "delta": units[primary]["delta"], "unit": primary}
        if why := unnoised_why(units):
            out["epsilon"], out["why"] = "inf", why
        for name, u in units.items():
            out[name] = {"epsilon": u["epsilon"], "delta": u["delta"], "steps": u["steps"]}
        return out

    def summary(self, status: str) -> dict[str, Any]:
        """``summary.json``: public facts, the released model's final test metrics and the privacy report."""
        last = next((h for h in reversed(self.history) if evaluated(h)), {})
        final = {k: last[k] for k in last if k not in PUBLIC_ROUND_KEYS}
        cos = last.get("W_mean_cos")
        if self.selected is not None:  # a centralised baseline reports the epoch it selected on validation
            final, cos = self.selected["metrics"], self.selected["W_mean_cos"]
        out = {
            "algorithm": self.cfg.algorithm.name,
            "dataset": self.dataset.name,
            "rounds_completed": self.round,
            "rounds_planned": self.cfg.training.rounds,
            "rounds_aborted": self.rounds_aborted,
            "status": status,
            "final": final,
            "W_mean_cos": cos,
            "privacy": self.privacy_summary(),
            "protocols": list(self.cfg.protocols),
            "stop_reason": self.stop_reason,
            "device": str(self.device),
            "executor": self.executor.name,
            "num_clients": len(self.fed.clients),
            "dropped_labels": self.dataset.meta.get("dropped_labels", []),
        }
        if charge := self.aborted_charge():
            out["aborted_charge"] = charge
        ev = self.cfg.evaluation
        if ev.target_value is not None:
            out["target"] = {"metric": ev.target_metric, "value": ev.target_value,
                             "rounds_to_target": rounds_to_target(self.history, ev.target_metric, ev.target_value)}  # fmt: skip
            reported = sorted({k for h in self.history for k in h if k not in ("round", "privacy")})
            if reported and ev.target_metric not in reported:  # null would read as "never reached"
                out["target"]["note"] = (f"no evaluated round reports {ev.target_metric!r} (evaluation.target_metric); "
                                         f"this run's metrics: {', '.join(reported)}")  # fmt: skip
        if self.selected is not None:
            out["selected_round"] = self.selected["round"]
            out["selection"] = f"{self._selection_metric()} on a validation split of the training data"
        return out

    def aborted_charge(self) -> dict[str, dict[str, int]] | None:
        """What the privacy ledger charged for the rounds a protocol aborted, per DP unit: ``{"steps": n, "of": total}``
        (an aborted round's cohort trained and the abort is observable, so it is charged like any other). Read from
        the released per-round ledger (each metrics line's steps) at the aborted rounds; None when no round aborted
        or no DP unit charged anything for them."""
        aborted = {d["round"] for d in self.diagnostics if "aborted" in d}
        if not aborted:
            return None
        before: dict[str, int] = {}
        charged: dict[str, int] = {}
        for rec in self.history:
            for name, u in (rec.get("privacy") or {}).items():
                if not (isinstance(u, dict) and "steps" in u):
                    continue
                if rec["round"] in aborted:
                    charged[name] = charged.get(name, 0) + u["steps"] - before.get(name, 0)
                before[name] = u["steps"]
        out = {name: {"steps": n, "of": before[name]} for name, n in charged.items() if n}
        return out or None

    def privacy_summary(self) -> dict[str, Any]:
        units = self.stack.privacy()
        if not units:
            return {"epsilon": "inf", "delta": None, "note": "no differential privacy mechanism in this run"}
        now = self.privacy_now()
        out = {"epsilon": now["epsilon"], "delta": now["delta"], "unit": now["unit"], "units": units}
        if "why" in now:
            out["why"] = now["why"]
        warnings = sorted({u["warning"] for u in units.values() if "warning" in u})
        if warnings:
            out["warning"] = "; ".join(warnings)
        return out

    def private_summary(self) -> dict[str, Any]:
        """Statistics of private data for the operator (``private/summary.json``): never released."""
        return {
            "wall_seconds": self.wall_before,
            "seconds_per_round": self.wall_before / max(self.round, 1),
            "setup": self.setup_facts,
            # training instances the public contribution bound changed (secure_fed.data.bounding)
            "bounded_instances": self.fed.bounded_instances,
            # counts of client updates: under secret (Poisson) client sampling the cohort sizes are private
            "executor": self.executor.report(),
            "protocols": self.stack.private_report(),
            "last_round": self.diagnostics[-1] if self.diagnostics else None,
        }
