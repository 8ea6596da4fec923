"""Privacy accounting: one ledger per privacy unit, backed by Opacus accountants.

:class:`PrivacyUnit` records (σ, q) for each step of its mechanism in an Opacus
accountant (``rdp`` by default, ``prv`` or ``gdp``) and answers "what is ε
now" and "what would ε be after one more step" — the latter is how training
stops *before* a step that would exceed the budget. :func:`calibrate_sigma`
is the third of (ε, δ, σ) from the other two, over the planned steps.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

#: accountant names accepted in YAML → Opacus mechanism names
ACCOUNTANTS = {"rdp": "rdp", "prv": "prv", "gdp": "gdp"}


def make_accountant(name: str):
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {name!r}; choose one of {sorted(ACCOUNTANTS)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gdp warns that it is experimental; documented in the README
        return create_accountant(ACCOUNTANTS[name])


def epsilon_of(history: list[tuple[float, float, int]], delta: float, accountant: str) -> float:
    """ε of a (σ, q, steps) history, computed by a fresh Opacus accountant."""
    if not history:
        return 0.0
    acc = make_accountant(accountant)
    acc.history = [tuple(h) for h in history]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta))


def calibrate_sigma(*, target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str) -> float:
    """The smallest σ (to 0.5% of ε) whose ε after ``steps`` steps at rate q is ≤ the target (Opacus)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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


class PrivacyUnit:
    """The ledger of one privacy unit (``instance`` or ``client``).

    Args:
        name: the unit.
        scope: which mechanism the ε covers, in words.
        sigma, sample_rate: the mechanism's noise multiplier and sampling rate.
        delta, target_epsilon: the budget (target may be None: no enforcement).
        not_covered: data uses outside this mechanism (reported, never hidden).
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
    ):
        self.name, self.scope = name, scope
        self.sigma, self.sample_rate = float(sigma), float(sample_rate)
        self.delta, self.accountant_name = float(delta), accountant
        self.target_epsilon = target_epsilon
        self.clip_norm = clip_norm
        self.calibrated = calibrated
        self.planned_steps = planned_steps
        self.not_covered = list(not_covered or [])
        self.accountant = make_accountant(accountant)
        self.steps = 0

    def epsilon(self) -> float:
        if not self.accountant.history:
            return 0.0
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(self.accountant.get_epsilon(self.delta))

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
        return {
            "epsilon": eps if math.isfinite(eps) else "inf",
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

    def state_dict(self) -> dict[str, Any]:
        return {"history": [tuple(h) for h in self.accountant.history], "steps": self.steps, "sigma": self.sigma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant = make_accountant(self.accountant_name)
        self.accountant.history = [tuple(h) for h in state["history"]]
        self.steps = int(state["steps"])
        self.sigma = float(state["sigma"])
