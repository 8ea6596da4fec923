"""Privacy accounting: one ledger per privacy unit, backed by Opacus accountants.

:class:`PrivacyUnit` records (σ, q) for each step of its mechanism in an Opacus
accountant (``rdp`` by default, or ``prv``) and answers "what is ε now" and
"what would ε be after one more step" — the latter is how training stops
*before* a step that would exceed the budget. :func:`calibrate_sigma` is the
third of (ε, δ, σ) from the other two, over the planned steps, and the σ it
returns keeps ε within the target by *both* accountants.

Opacus's GDP accountant is not an accountant here: it is a central-limit
approximation that can understate ε (at σ 1.23, q 0.1, 50 steps, δ 1e-5:
RDP 3.99, PRV 3.53, GDP 2.84). :func:`gdp_epsilon` reports it, with Opacus's
own warning, for comparison only; it never calibrates σ and never stops training.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from opacus.accountants import GaussianAccountant, create_accountant
from opacus.accountants.utils import get_noise_multiplier

#: accountant names accepted in YAML → Opacus mechanism names (the ones that may calibrate σ and stop training)
ACCOUNTANTS = {"rdp": "rdp", "prv": "prv"}

#: the one numerical warning filtered out (see :func:`_get_epsilon`): with q = 1 Opacus's PRV evaluates
#: ``np.log(1 - q)`` = log 0 = -inf on purpose (the support bound of the privacy loss); the -inf is handled
#: correctly by the ``np.where`` around it, so numpy's "divide by zero" RuntimeWarning carries no information.
_PRV_Q1_LOG_WARNING = {
    "message": "divide by zero encountered in log",
    "category": RuntimeWarning,
    "module": r"opacus\.accountants\.analysis\.prv\.prvs",
}

#: the step by which :func:`calibrate_sigma` raises σ when an accountant still exceeds the target, and how often
_SIGMA_STEP, _MAX_SIGMA_STEPS = 1.005, 2000


def reported(epsilon: float) -> float | str:
    """ε as the reports write it: a number, or ``"inf"`` (JSON has no infinity)."""
    return epsilon if math.isfinite(epsilon) else "inf"


def make_accountant(name: str):
    """A fresh Opacus accountant (``rdp`` or ``prv``). Its warnings reach the caller."""
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {name!r}; choose one of {sorted(ACCOUNTANTS)}")
    return create_accountant(ACCOUNTANTS[name])


def _get_epsilon(acc, delta: float) -> float:
    """``acc.get_epsilon(delta)``; every warning passes except PRV's cosmetic log(1 - q) at q = 1 (named above)."""
    with warnings.catch_warnings():
        if acc.mechanism() == "prv" and any(float(q) >= 1.0 for _, q, _ in acc.history):
            warnings.filterwarnings("ignore", **_PRV_Q1_LOG_WARNING)
        return float(acc.get_epsilon(delta))


def epsilon_of(history: list[tuple[float, float, int]], delta: float, accountant: str) -> float:
    """ε of a (σ, q, steps) history, computed by a fresh Opacus accountant (``rdp`` or ``prv``)."""
    acc = make_accountant(accountant)
    if not history:
        return 0.0
    acc.history = [tuple(h) for h in history]
    return _get_epsilon(acc, delta)


def _solve_sigma(*, target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str) -> float:
    """Opacus's bisection: the smallest σ (to 0.5% of ε) whose ε by ``accountant`` is ≤ the target.

    Warnings raised while Opacus probes trial σ values (e.g. "optimal order is the largest alpha" at the
    σ = 20 it starts from) describe those trial values, not the answer, and are dropped here; the answer is
    re-evaluated by :func:`calibrate_sigma` outside this function, where its warnings are shown.
    """
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=ACCOUNTANTS[accountant],
                epsilon_tolerance=0.005 * target_epsilon,
            )
        )


def calibrate_sigma(*, target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str) -> float:
    """The smallest σ (to 0.5% of ε) whose ε after ``steps`` steps at rate q is ≤ the target by RDP *and* PRV.

    σ is first solved with Opacus's ``get_noise_multiplier`` for the RDP accountant (cheap, and in practice
    the binding one: RDP's ε is above PRV's), then checked with both accountants. An accountant that still
    exceeds the target gets its own solve (σ becomes the larger of the two), and if rounding still leaves
    one above the target σ is raised by 0.5% steps until both hold. The answer is therefore the same for
    ``accountant="rdp"`` and ``"prv"`` (the name is validated); ``prv`` still governs the ledger and stopping.
    """
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {accountant!r}; choose one of {sorted(ACCOUNTANTS)}")
    kw = {"target_epsilon": target_epsilon, "delta": delta, "sample_rate": sample_rate, "steps": steps}
    sigma = _solve_sigma(**kw, accountant="rdp")
    solved = {"rdp"}
    for _ in range(_MAX_SIGMA_STEPS):
        over = [name for name in ACCOUNTANTS if epsilon_of([(sigma, sample_rate, steps)], delta, name) > target_epsilon]
        if not over:
            return sigma
        fresh = [name for name in over if name not in solved]
        if fresh:
            solved.update(fresh)
            sigma = max([sigma] + [_solve_sigma(**kw, accountant=name) for name in fresh])
        else:
            sigma *= _SIGMA_STEP
    raise RuntimeError(
        f"no σ ≤ {sigma:g} keeps ε ≤ {target_epsilon:g} by both rdp and prv (δ = {delta:g}, q = {sample_rate:g}, {steps} steps)"
    )


def gdp_epsilon(history: list[tuple[float, float, int]], delta: float) -> tuple[float, str]:
    """Opacus's GDP (Gaussian DP, central-limit) ε of a (σ, q, steps) history, and Opacus's warning text.

    APPROXIMATE: GDP can understate ε (at σ 1.23, q 0.1, 50 steps, δ 1e-5 it gives 2.84 where PRV gives 3.53).
    It is reported for comparison only and is never used to calibrate σ or to stop training. The warnings
    Opacus emits are returned and also re-emitted to the caller (``stacklevel=2``), never suppressed.
    Opacus's GDP accountant needs one (σ, q) throughout: entries with the same (σ, q) are merged, and a
    history with several raises ValueError.
    """
    merged: dict[tuple[float, float], int] = {}
    for sigma, q, steps in history:
        key = (float(sigma), float(q))
        merged[key] = merged.get(key, 0) + int(steps)
    if len(merged) > 1:
        raise ValueError(f"GDP accounting needs one (σ, q) throughout; the history has {sorted(merged)}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acc = GaussianAccountant()
        acc.history = [(sigma, q, steps) for (sigma, q), steps in merged.items()]
        eps = float(acc.get_epsilon(delta)) if acc.history else 0.0
    for w in caught:
        warnings.warn(str(w.message), w.category, stacklevel=2)
    return eps, " ".join(str(w.message) for w in caught)


class PrivacyUnit:
    """The ledger of one privacy unit (``instance`` or ``client``).

    Args:
        name: the unit.
        scope: which mechanism the ε covers, in words.
        sigma, sample_rate: the mechanism's noise multiplier and sampling rate.
        delta, target_epsilon: the budget (target may be None: no enforcement).
        accountant: ``rdp`` or ``prv``: the accountant of the ledger, the report and the stopping rule.
        not_covered: data uses outside this mechanism (reported, never hidden).
        report_gdp: also report Opacus's approximate GDP ε (with its warning) under ``"approximate"``.
    """

    def __init__(
        self,
        *,
        name: str,
        scope: str,
        sigma: float,
        sample_rate: float,
        delta: float,
        accountant: str,
        target_epsilon: float | None,
        clip_norm: float,
        calibrated: bool,
        planned_steps: int,
        not_covered: list[str] | None = None,
        report_gdp: bool = False,
    ):
        self.name, self.scope = name, scope
        self.sigma, self.sample_rate = float(sigma), float(sample_rate)
        self.delta, self.accountant_name = float(delta), accountant
        self.target_epsilon = target_epsilon
        self.clip_norm = clip_norm
        self.calibrated = calibrated
        self.planned_steps = planned_steps
        self.not_covered = list(not_covered or [])
        self.report_gdp = bool(report_gdp)
        self.accountant = make_accountant(accountant)
        self.steps = 0

    def epsilon(self) -> float:
        if not self.accountant.history:
            return 0.0
        return _get_epsilon(self.accountant, self.delta)

    def epsilon_after(self, steps: int = 1) -> float:
        hist = [tuple(h) for h in self.accountant.history]
        if hist and hist[-1][:2] == (self.sigma, self.sample_rate):
            hist[-1] = (self.sigma, self.sample_rate, hist[-1][2] + steps)
        else:
            hist.append((self.sigma, self.sample_rate, steps))
        return epsilon_of(hist, self.delta, self.accountant_name)

    def stop_reason(self) -> str | None:
        """Why the next step must not run (it would exceed the target), or None."""
        if self.target_epsilon is None:
            return None
        nxt = self.epsilon_after(1)
        if nxt > self.target_epsilon:
            return (
                f"{self.name}-level budget: one more step would reach ε = {nxt:.4g} > target {self.target_epsilon:g} "
                f"(δ = {self.delta:g}); stopped after {self.steps} steps at ε = {self.epsilon():.4g}"
            )
        return None

    def step(self) -> None:
        self.accountant.step(noise_multiplier=self.sigma, sample_rate=self.sample_rate)
        self.steps += 1

    def report(self) -> dict[str, Any]:
        eps = self.epsilon()
        out = {
            "epsilon": reported(eps),
            "delta": self.delta,
            "accountant": self.accountant_name,
            "noise_multiplier": self.sigma,
            "sample_rate": self.sample_rate,
            "clip_norm": self.clip_norm,
            "steps": self.steps,
            "planned_steps": self.planned_steps,
            "target_epsilon": self.target_epsilon,
            "sigma_calibrated": self.calibrated,
            "scope": self.scope,
            "not_covered": self.not_covered,
        }
        if self.report_gdp:
            try:
                g_eps, g_warning = gdp_epsilon([tuple(h) for h in self.accountant.history], self.delta)
                g_value: float | str | None = reported(g_eps)
            except ValueError as err:  # several (σ, q) in the history: GDP has no answer
                g_value, g_warning = None, str(err)
            out["approximate"] = {"gdp": {"epsilon": g_value, "warning": g_warning}}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"history": [tuple(h) for h in self.accountant.history], "steps": self.steps, "sigma": self.sigma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant = make_accountant(self.accountant_name)
        self.accountant.history = [tuple(h) for h in state["history"]]
        self.steps = int(state["steps"])
        self.sigma = float(state["sigma"])
