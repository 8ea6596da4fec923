"""Privacy accounting: one ledger per privacy unit, backed by a registered accountant
(:mod:`protocols.dp.accountants`: ``rdp`` by default, ``prv`` or ``pld``).

:class:`PrivacyUnit` records (σ, q) for each step of its mechanisms in its accountant and answers "what is ε now"
and "what would ε be after one more step" — the latter is how training stops *before* a step that would exceed the
budget. :func:`calibrate_sigma` is the third of (ε, δ, σ) from the other two, over the planned steps, and the σ it
returns keeps ε within the target by RDP and PRV (every accountant whose class ``bounds_every_calibration``) and by
the run's own accountant: σ is solved by RDP, then verified by the others and raised where one still exceeds the
target. :func:`make_accountant` and :func:`epsilon_of` go through the registry; no accountant is named here.

Opacus's GDP accountant is not an accountant here: it is a central-limit
approximation that can understate ε (at σ 1.23, q 0.1, 50 steps, δ 1e-5:
RDP 4.00, PRV 3.53, GDP 2.84). :func:`gdp_epsilon` reports it, with Opacus's
own warning, for comparison only; it never calibrates σ and never stops training.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

from opacus.accountants import GaussianAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis
from opacus.accountants.utils import get_noise_multiplier

from protocols.dp.accountants import ACCOUNTANTS, accountant_class, epsilon_of, make_accountant
from protocols.dp.accountants.prv import PRV_MAX_RDP_EPSILON
from protocols.dp.accountants.rdp import LARGEST_ORDER_WARNING, rdp_curve_epsilon
from protocols.dp.mechanisms import MECHANISMS, RDP_ORDERS, DPMechanism, run_mechanisms

#: the step by which :func:`calibrate_sigma` raises σ when an accountant still exceeds the target, and how often
_SIGMA_STEP, _MAX_SIGMA_STEPS = 1.005, 2000


def reported(epsilon: float) -> float | str:
    """ε as the reports write it: a number, or ``"inf"`` (JSON has no infinity)."""
    return epsilon if math.isfinite(epsilon) else "inf"


def must_hold(accountant: str) -> list[str]:
    """The accountants a calibrated σ must satisfy: every registered one that ``bounds_every_calibration`` (RDP and
    PRV), then the run's ``accountant`` (validated: ValueError for a name not registered)."""
    accountant_class(accountant)
    names = [name for name, cls in ACCOUNTANTS.items() if cls.bounds_every_calibration]
    return names + ([accountant] if accountant not in names else [])


def _bisect_up(eps: Callable[[float], float], target: float, sigma: float) -> float:
    """The smallest σ' ≥ σ (to 0.1%, by bisection on log σ) with ``eps(σ') ≤ target``, for an ε decreasing in σ."""
    if not sigma > 0.0:
        raise ValueError(f"σ {sigma} cannot start a bisection on log σ")
    lo, hi = sigma, sigma * 2.0
    while eps(hi) > target:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"target ε {target:g} cannot be met with σ ≤ 1e6")
    while hi / lo > 1.001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= target else (mid, hi)
    return hi


def _solve_sigma(*, target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str,
                 above: float = 0.0) -> float:  # fmt: skip
    """The smallest σ (to 0.5% of ε, or 0.1% of σ) whose ε by ``accountant`` is ≤ the target: Opacus's bisection for
    an accountant with an Opacus name (``opacus_name``), else :func:`_bisect_up` from ``above`` (a σ known to exceed it).

    Warnings raised while the trial σ values are probed (e.g. "optimal order is the largest alpha" at the
    σ = 20 Opacus starts from) describe those trial values, not the answer, and are dropped here; the answer is
    re-evaluated by :func:`calibrate_sigma` outside this function, where its warnings are shown.
    """
    opacus_name = accountant_class(accountant).opacus_name
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        if opacus_name is None:
            return _bisect_up(lambda s: epsilon_of([(s, sample_rate, steps)], delta, accountant), target_epsilon, above)
        return float(
            get_noise_multiplier(
                target_epsilon=target_epsilon,
                target_delta=delta,
                sample_rate=sample_rate,
                steps=steps,
                accountant=opacus_name,
                epsilon_tolerance=0.005 * target_epsilon,
            )
        )


def _calibration_floor(sample_rate: float, delta: float) -> float:
    """The smallest ε Opacus's calibration can reach (one step at its ceiling σ = 1e6, over its own orders ≤ 63, whose
    largest is then optimal: the note is the point here, so it is not shown)."""
    curve = privacy_analysis.compute_rdp(q=sample_rate, noise_multiplier=1e6, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", **LARGEST_ORDER_WARNING)
        return float(privacy_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=curve, delta=delta)[0])


def calibrate_sigma(*, target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str) -> float:
    """The smallest σ (to 0.5% of ε) whose ε after ``steps`` steps at rate q is ≤ the target by RDP, PRV and the run's
    ``accountant`` (:func:`must_hold`).

    σ is first solved with Opacus's ``get_noise_multiplier`` for the RDP accountant (cheap, and in practice
    the binding one: RDP's ε is above PRV's and PLD's), then checked with the others. An accountant that still
    exceeds the target gets its own solve (σ becomes the larger), and if rounding still leaves one above the target
    σ is raised by 0.5% steps until all hold. The answer is therefore the same for ``rdp`` and ``prv``, and for
    ``pld`` wherever PLD's ε is below RDP's (everywhere measured); the name governs the ledger and stopping.
    """
    names = must_hold(accountant)
    kw = {"target_epsilon": target_epsilon, "delta": delta, "sample_rate": sample_rate, "steps": steps}
    try:
        sigma = _solve_sigma(**kw, accountant="rdp")
    except ValueError:  # Opacus: "The privacy budget is too low." (no σ up to its ceiling of 1e6 reaches the target)
        raise ValueError(
            f"target ε {target_epsilon:g} cannot be met with σ ≤ 1e6 (δ = {delta:g}, q = {sample_rate:g}, {steps} steps; "
            f"the RDP accountant certifies no ε below about {_calibration_floor(sample_rate, delta):.3g} at this δ)"
        ) from None
    solved = {"rdp"}
    for _ in range(_MAX_SIGMA_STEPS):
        over = [name for name in names if epsilon_of([(sigma, sample_rate, steps)], delta, name) > target_epsilon]
        if not over:
            return sigma
        fresh = [name for name in over if name not in solved]
        if fresh:
            solved.update(fresh)
            sigma = max([sigma] + [_solve_sigma(**kw, accountant=name, above=sigma) for name in fresh])
        else:
            sigma *= _SIGMA_STEP
    raise RuntimeError(
        f"no σ ≤ {sigma:g} keeps ε ≤ {target_epsilon:g} by {' and '.join(names)} "
        f"(δ = {delta:g}, q = {sample_rate:g}, {steps} steps)"
    )


def calibrate_shared_sigma(
    *, target_epsilon: float, delta: float, parts: list[tuple[float, int, float | None]], accountant: str
) -> float:
    """One σ for every mechanism of a unit that has none, so that the composition of all of them over their planned
    steps keeps ε ≤ the target by RDP, PRV and the run's ``accountant`` (:func:`must_hold`).

    ``parts`` holds each mechanism's (sample rate q, planned steps, σ or None); the ones with None share the answer.
    With a single part this is :func:`calibrate_sigma`. Raises ValueError when the mechanisms with a fixed σ
    already exceed the target over their planned steps (no σ for the others can help).
    """
    names = must_hold(accountant)
    free = [(q, n) for q, n, s in parts if s is None and n > 0]
    fixed = [(float(s), q, n) for q, n, s in parts if s is not None and n > 0]
    if not free:
        raise ValueError("calibrate_shared_sigma: every mechanism already has a σ")
    if len(free) == 1 and not fixed:
        q, n = free[0]
        return calibrate_sigma(target_epsilon=target_epsilon, delta=delta, sample_rate=q, steps=n, accountant=accountant)
    worst = max(epsilon_of(fixed, delta, name) for name in names) if fixed else 0.0
    if worst >= target_epsilon:
        raise ValueError(
            f"target ε {target_epsilon:g} cannot be met: the mechanisms with a fixed noise_multiplier already spend "
            f"ε = {worst:.4g} over their planned steps"
        )

    def eps(sigma: float, name: str) -> float:
        with warnings.catch_warnings(record=True):  # trial σ values' warnings describe them, not the answer
            warnings.simplefilter("always")
            return epsilon_of(fixed + [(sigma, q, n) for q, n in free], delta, name)

    lo, hi = 0.3, 1.0
    while eps(hi, "rdp") > target_epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"target ε {target_epsilon:g} cannot be met with σ ≤ 1e6")
    while hi / lo > 1.001:  # RDP bisection on log σ (RDP is the binding accountant in practice, as above)
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid, "rdp") <= target_epsilon else (mid, hi)
    sigma = hi
    for name in names:  # another accountant still above the target: its own bisection from there
        if eps(sigma, name) > target_epsilon:
            sigma = _bisect_up(lambda s, name=name: eps(s, name), target_epsilon, sigma)
    for _ in range(_MAX_SIGMA_STEPS):
        if all(eps(sigma, name) <= target_epsilon for name in names):
            return sigma
        sigma *= _SIGMA_STEP
    raise RuntimeError(f"no σ ≤ {sigma:g} keeps ε ≤ {target_epsilon:g} by {' and '.join(names)}")


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
    if any(sigma == 0.0 and n for (sigma, _), n in merged.items()):
        return math.inf, "a noiseless step (noise multiplier 0): no Gaussian bound"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        acc = GaussianAccountant()
        acc.history = [(sigma, q, steps) for (sigma, q), steps in merged.items()]
        eps = float(acc.get_epsilon(delta)) if acc.history else 0.0
    for w in caught:
        warnings.warn(str(w.message), w.category, stacklevel=2)
    return eps, " ".join(str(w.message) for w in caught)


class PrivacyUnit:
    """The ledger of one privacy unit (``instance`` or ``client``): one ε for every mechanism its data goes through.

    The first mechanism is given by the keyword arguments (``sigma``, ``sample_rate``, ``clip_norm``, …);
    :meth:`add_mechanism` adds more (the instance unit composes the server's W step with DP-SGD in client
    training). The ledger holds one (σ, q, steps) entry per distinct (σ, q): composition does not depend on
    the order of the steps, so ε is that of the whole history whatever the interleaving.

    Args:
        name: the unit.
        scope: which mechanism the ε covers, in words.
        sigma, sample_rate: the first mechanism's noise multiplier and sampling rate.
        delta, target_epsilon: the budget (target may be None: no enforcement).
        accountant: a registered accountant's name (``rdp``, ``prv``, ``pld``): the accountant of the ledger, the
            report and the stopping rule.
        not_covered: data uses outside this unit's mechanisms (reported, never hidden).
        report_gdp: also report Opacus's approximate GDP ε (with its warning) under ``"approximate"``.
        mechanism: the first mechanism's name (default: the unit's).
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
        mechanism: str | None = None,
        kind: str | None = None,
        mechanism_options: dict[str, Any] | None = None,
    ):
        self.name, self.scope = name, scope
        self.delta, self.accountant_name = float(delta), accountant
        self.target_epsilon = target_epsilon
        self.not_covered = list(not_covered or [])
        #: released tensors no mechanism needs to cover (data-independent: e.g. a fixed encoder), named in the report
        self.fixed: list[str] = []
        self.report_gdp = bool(report_gdp)
        self.mechanisms: dict[str, DPMechanism] = {}
        self.primary = mechanism or name
        self.add_mechanism(
            self.primary, kind=kind, scope=scope, sigma=sigma, sample_rate=sample_rate, clip_norm=clip_norm,
            calibrated=calibrated, planned_steps=planned_steps, **(mechanism_options or {}),
        )  # fmt: skip
        self.accountant = make_accountant(accountant)

    def add_mechanism(self, name: str, *, kind: str | None = None, **kw: Any) -> DPMechanism:
        """Add a declared mechanism of the registered ``kind`` (:data:`protocols.dp.mechanisms.MECHANISMS`); None: an
        undeclared subsampled Gaussian (a ledger outside a run, as the tests and the selection build)."""
        if name in self.mechanisms:
            raise ValueError(f"privacy unit {self.name!r} already has a mechanism {name!r}")
        if kind is not None and kind not in run_mechanisms():
            raise ValueError(f"unknown mechanism kind {kind!r} for a run's ledger; registered: {sorted(run_mechanisms())}")
        self.mechanisms[name] = m = (DPMechanism if kind is None else MECHANISMS[kind])(name=name, **kw)
        return m

    def mechanism(self, name: str | None = None) -> DPMechanism:
        return self.mechanisms[name or self.primary]

    # the first mechanism's numbers, as the reports and the single-mechanism callers read them
    @property
    def sigma(self) -> float:
        return self.mechanism().sigma

    @property
    def sample_rate(self) -> float:
        return self.mechanism().sample_rate

    @property
    def clip_norm(self) -> float:
        return self.mechanism().clip_norm

    @property
    def calibrated(self) -> bool:
        return self.mechanism().calibrated

    @property
    def planned_steps(self) -> int:
        return self.mechanism().planned_steps

    @property
    def steps(self) -> int:
        return self.mechanism().steps

    def epsilon(self) -> float:
        return self.accountant.get_epsilon(self.delta)

    def _history_after(self, steps: dict[str, int]) -> list[tuple[float, float, int]]:
        hist = [tuple(h) for h in self.accountant.history]
        for name, n in steps.items():
            m = self.mechanisms[name]
            if n <= 0:
                continue
            for i, (s, q, k) in enumerate(hist):
                if (s, q) == (m.sigma, m.sample_rate):
                    hist[i] = (s, q, k + n)
                    break
            else:
                hist.append((m.sigma, m.sample_rate, n))
        return hist

    def epsilon_after(self, steps: int = 1, mechanism: str | None = None) -> float:
        """ε once ``steps`` more steps of ``mechanism`` (default: the first) have run."""
        return epsilon_of(self._history_after({mechanism or self.primary: steps}), self.delta, self.accountant_name)

    def stop_reason(self, steps: int = 1, mechanism: str | None = None, *, plan: dict[str, int] | None = None) -> str | None:
        """Why the next ``steps`` steps of ``mechanism`` (or the steps of several mechanisms in ``plan``, name →
        count) must not run (they would exceed the target), or None. The budget is the proven one: a run whose
        accountant is not ``rdp`` (PRV, PLD: the continuous Gaussian's, not proven for the discrete Gaussian every
        release draws) also stops before the ledger's proven RDP ε would pass the target."""
        if self.target_epsilon is None:
            return None
        plan = plan if plan is not None else {mechanism or self.primary: steps}
        after = self._history_after(plan)
        nxt = max(epsilon_of(after, self.delta, name) for name in dict.fromkeys([self.accountant_name, "rdp"]))
        if nxt > self.target_epsilon:
            n = sum(plan.values())
            if len(self.mechanisms) == 1:
                what = "one more step" if n == 1 else f"the next {n} steps"
            else:
                what = "the next " + " and ".join(
                    f"{k} step{'s' if k != 1 else ''} of {name}" for name, k in plan.items() if k > 0
                )
            return (
                f"{self.name}-level budget: {what} would reach ε = {nxt:.4g} > target {self.target_epsilon:g} "
                f"(δ = {self.delta:g}); stopped after {self._steps_text()} at ε = {self.epsilon():.4g}"
            )
        return None

    def _steps_text(self) -> str:
        if len(self.mechanisms) == 1:
            return f"{self.steps} steps"
        return ", ".join(f"{m.steps} steps of {n}" for n, m in self.mechanisms.items())

    def step(self, count: int = 1, mechanism: str | None = None) -> None:
        """Record ``count`` steps of ``mechanism`` (default: the first)."""
        if count <= 0:
            return
        m = self.mechanism(mechanism)
        self.accountant.history = self._history_after({m.name: count})
        m.steps += count

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
            **(
                {
                    "epsilon_bound": f"RDP's (ε is past what the {self.accountant.title} accountant computes: "
                    f"RDP ε > {self.accountant.max_rdp_epsilon:g})"
                }
                if math.isfinite(eps) and self.accountant.beyond_range(self.delta)
                else {}
            ),  # fmt: skip
            "scope": self.scope,
            "not_covered": self.not_covered,
            **({"fixed": self.fixed} if self.fixed else {}),
        }
        if len(self.mechanisms) > 1:
            out["mechanisms"] = {n: m.report() for n, m in self.mechanisms.items()}
            out["composition"] = "one ledger over every mechanism: ε is the accountant's composition of all their (σ, q, steps)"
        if self.report_gdp:
            try:
                g_eps, g_warning = gdp_epsilon([tuple(h) for h in self.accountant.history], self.delta)
                g_value: float | str | None = reported(g_eps)
            except ValueError as err:  # several (σ, q) in the history: GDP has no answer
                g_value, g_warning = None, str(err)
            out["approximate"] = {"gdp": {"epsilon": g_value, "warning": g_warning}}
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "history": [tuple(h) for h in self.accountant.history],
            "steps": self.steps,
            "sigma": self.sigma,
            "mechanisms": {n: {"steps": m.steps, "sigma": m.sigma} for n, m in self.mechanisms.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant = make_accountant(self.accountant_name, state["history"])
        mech = state.get("mechanisms") or {self.primary: {"steps": state["steps"], "sigma": state["sigma"]}}
        for n, st in mech.items():
            self.mechanisms[n].steps = int(st["steps"])
            self.mechanisms[n].sigma = float(st["sigma"])


# ---------------------------------------------------------------- the grid correction of discretised noise
#: every DP draw is released on a grid of step γ (:mod:`protocols.dp.discrete_gaussian`); the grid's share of the
#: sensitivity, γ·√d / Δ, is at most 2^-GRID_CORRECTION_BITS (0.098%) wherever secure aggregation's encoding allows
GRID_CORRECTION_BITS = 10


def noise_grid(sensitivity: float, dim: int, *, coarsest_below: float | None = None) -> float:
    """The public grid step γ of a released sum of ``dim`` coordinates with L2 sensitivity ``sensitivity``: the
    largest power of two with γ·√d ≤ 2^-:data:`GRID_CORRECTION_BITS`·Δ, so the rounding adds at most 0.1% to Δ
    (:func:`grid_sensitivity`). A power of two, so γ·k is exact in float64 for |k| < 2^53 and survives a fixed-point
    encoding with at least −log₂ γ fractional bits. ``coarsest_below`` (secure aggregation's 2^-frac_bits) is a
    floor: a share finer than the encoding would be rounded again by it, so γ is never below it (the correction is
    then larger, and still accounted by :func:`grid_sensitivity`)."""
    if not (sensitivity > 0.0 and math.isfinite(sensitivity)) or dim < 1:
        raise ValueError(f"noise_grid: sensitivity {sensitivity} and dim {dim} must be positive")
    gamma = 2.0 ** math.floor(math.log2(sensitivity * 2.0**-GRID_CORRECTION_BITS / math.sqrt(dim)))
    while gamma * math.sqrt(dim) > sensitivity * 2.0**-GRID_CORRECTION_BITS:  # log2's rounding at a power of two
        gamma /= 2.0
    return max(gamma, coarsest_below) if coarsest_below is not None else gamma


def grid_sensitivity(sensitivity: float, grid: float, dim: int) -> float:
    """The L2 sensitivity of a sum after rounding it to the grid γ: Δ + γ·√d.

    Rounding each of d coordinates to the nearest multiple of γ moves it by at most γ/2, so the rounded sums of two
    neighbouring data sets differ by at most Δ + 2·(γ/2)·√d (and a client's own rounded update has norm at most
    Δ + γ√d/2). The noise is calibrated to this sensitivity (:func:`grid_corrected_std`), so the ledger keeps the
    configured or calibrated σ as the noise multiplier of the rounded mechanism."""
    return float(sensitivity) + float(grid) * math.sqrt(dim)


def grid_corrected_std(sigma: float, sensitivity: float, grid: float, dim: int) -> float:
    """Noise std σ·(Δ + γ√d): the accountant's σ applied to the grid-rounded sum's sensitivity. With
    :func:`noise_grid` the factor (1 + γ√d/Δ) is at most 1 + 2^-10 (Bibtex's W step, Δ = 2C, d = 159·512: γ = 2^-8
    for C = 1000, factor 1.00056; a 3.45M-coordinate DP-SGD sum at C = 1: γ = 2^-21, factor 1.00089)."""
    return float(sigma) * grid_sensitivity(sensitivity, grid, dim)


__all__ = [
    "ACCOUNTANTS", "GRID_CORRECTION_BITS", "PRV_MAX_RDP_EPSILON", "RDP_ORDERS", "PrivacyUnit", "calibrate_shared_sigma",
    "calibrate_sigma", "epsilon_of", "gdp_epsilon", "grid_corrected_std", "grid_sensitivity", "make_accountant",
    "must_hold", "noise_grid", "rdp_curve_epsilon", "reported",
]  # fmt: skip
