"""Private hyperparameter selection (Papernot & Steinke, ICLR 2022, "Hyperparameter Tuning with Renyi Differential
Privacy"): the ε of releasing the best of a random number K of DP training runs.

The mechanism A: draw K from the truncated negative binomial distribution D_{η,γ} (η = 1: geometric, η = 0:
logarithmic), run Q (one candidate, drawn uniformly with replacement from a public grid, trained as an ordinary DP run)
K times, release only the best output by a score. Papernot & Steinke's **Theorem 2**: if Q is (λ, ε)-RDP and
(λ̂, ε̂)-RDP (λ > 1, λ̂ ≥ 1), η > −1 and γ ∈ (0, 1), then A is (λ, ε')-RDP with

    ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ) / λ̂ + log(E[K]) / (λ − 1),

    E[K] = η(1 − γ) / (γ(1 − γ^η))  (η ≠ 0),   E[K] = (1/γ − 1) / log(1/γ)  (η = 0; E[K] = 1/γ at η = 1).

Here Q's RDP curve is the maximum, order by order, of the grid candidates' curves (Q picks one of them at random; a
mixture's Rényi divergence is at most the largest of its parts'), each the sum over the run's mechanisms of the
subsampled Gaussian's RDP times its steps, proven for the discrete Gaussian the runs draw
(:func:`protocols.dp.discrete_gaussian_accounting.discrete_gaussian_subsampled_rdp`: Opacus's value at the integer
orders and at q = 1, interpolated at the fractional ones; :func:`rdp_curve`); ε̂ is the same curve at λ̂, minimised over λ̂ among the
orders for each λ; then Opacus's RDP → (ε, δ) conversion (``get_privacy_spent``), minimised over λ.

The theorem covers the released best output and nothing else: K, the unselected runs, their scores and the number
of runs must stay secret (releasing K voids it; so does redrawing after a failure: a second selection), and K must be
drawn by a secret RNG (:func:`draw_count` takes one; never the config seed). The Poisson variant (Theorem 6) is not
implemented here.
"""

from __future__ import annotations

import math
import random
from typing import ClassVar

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis

from protocols.dp.discrete_gaussian_accounting import discrete_gaussian_subsampled_rdp
from protocols.dp.mechanisms import CLIENT, INSTANCE, DPMechanism, register_mechanism

#: the Rényi orders of every curve here (Opacus's, as the ledgers use)
ORDERS = tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS)


def rdp_curve(history: list[tuple[float, float, int]]) -> np.ndarray:
    """The RDP curve at :data:`ORDERS` of a (σ, q, steps) history: the sum of each entry's subsampled-Gaussian RDP (the
    discrete Gaussian's proven curve)."""
    out = np.zeros(len(ORDERS))
    for sigma, q, steps in history:
        if steps > 0:
            out = out + steps * discrete_gaussian_subsampled_rdp(sigma, q, ORDERS)
    return out


def expected_count(eta: float, gamma: float) -> float:
    """E[K] of the truncated negative binomial D_{η,γ} (K ≥ 1)."""
    if not (eta > -1 and 0 < gamma < 1):
        raise ValueError(f"need η > -1 and 0 < γ < 1 (got η = {eta}, γ = {gamma})")
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def gamma_for_mean(mean: float, eta: float) -> float:
    """The γ whose D_{η,γ} has mean ``mean`` (> 1): E[K] decreases in γ, so a bisection."""
    if not mean > 1:
        raise ValueError(f"the mean number of runs must be > 1 (got {mean:g})")
    lo, hi = 1e-12, 1 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_count(eta, mid) > mean else (lo, mid)
    return (lo + hi) / 2


def count_pmf(k: int, eta: float, gamma: float) -> float:
    """P[K = k] of D_{η,γ}, k ≥ 1 (Papernot & Steinke, §2: ∝ (1 − γ)^k Π_{l<k} (l + η)/(l + 1)). η ≥ 0 only here
    (the theorem allows η ∈ (−1, 0), whose product has a negative first factor and is not computed in logs)."""
    if eta < 0:
        raise ValueError(f"η = {eta:g}: this implementation takes η ≥ 0 (1: geometric, 0: logarithmic)")
    if k < 1:
        return 0.0
    if eta == 0:
        return (1 - gamma) ** k / (k * math.log(1 / gamma))
    log_prod = sum(math.log((l + eta) / (l + 1)) for l in range(k))  # noqa: E741
    return math.exp(k * math.log(1 - gamma) + log_prod) / (gamma**-eta - 1)


def draw_count(rng: random.Random, eta: float, gamma: float) -> int:
    """K ~ D_{η,γ} by inversion of one uniform from ``rng``, which must be secret (e.g. ``secrets.SystemRandom()``)."""
    u, k, cdf = rng.random(), 0, 0.0
    while cdf <= u and k < 1_000_000:
        k += 1
        cdf += count_pmf(k, eta, gamma)
    return k


def selection_rdp(curve: np.ndarray, *, eta: float, gamma: float) -> np.ndarray:
    """Theorem 2's ε'(λ) at every order λ of :data:`ORDERS`, from Q's curve ε(·), with ε̂ = ε(λ̂) minimised over λ̂."""
    lam = np.asarray(ORDERS)
    hat = (1 + eta) * (1 - 1 / lam) * curve + (1 + eta) * math.log(1 / gamma) / lam  # one value per λ̂
    return curve + float(hat.min()) + math.log(expected_count(eta, gamma)) / (lam - 1)


def rdp_to_epsilon(rdp: np.ndarray, delta: float) -> float:
    """(ε, δ) from an RDP curve at :data:`ORDERS`: Opacus's conversion, minimised over the orders."""
    eps, _ = privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=delta)
    return float(eps)


@register_mechanism
class PrivateSelection(DPMechanism):
    """The declared mechanism of ``tradeoff --select private``: the best of K ~ D_{η,γ} DP runs, each a candidate
    drawn from a public grid.

    Declaration: it releases the best run's released files (θ, W, the report) and nothing of the others (K, the
    unselected runs and their scores stay in the study's private scratch); its unit is each candidate run's unit
    (the instance); its randomness is K and the candidates' draws, from a secret RNG; it adds no noise of its own (the
    candidates' mechanisms do). Its curve is Theorem 2's over Q's curve, Q's curve the order-wise maximum of the
    candidates' curves (:func:`rdp_curve` of each one's (σ, q, steps) history).

    ``level = "study"``: it composes runs, not the mechanisms inside one run, so no run's privacy graph holds it and
    the per-run worst-case check (tests/protocols/test_worst_case_combinations.py) has no combination for it; its
    own tests recompute Theorem 2 (tests/protocols/test_private_selection_mechanism.py)."""

    kind: ClassVar[str] = "private_selection"
    unit: ClassVar[str] = INSTANCE  # the class's default; an instance takes the candidates' unit (``unit=``)
    channel: ClassVar[str] = "selection"
    releases: ClassVar[tuple[str, ...]] = ("the selected run's released files",)
    noise_by: ClassVar[str] = "none (K and the draws from a secret RNG; the candidates' own mechanisms add the noise)"
    sample_known_to_server: ClassVar[bool] = False
    level: ClassVar[str] = "study"

    def __init__(self, *, histories: list[list[tuple[float, float, int]]], eta: float, gamma: float,
                 unit: str = INSTANCE, name: str = "selection"):  # fmt: skip
        if not histories:
            raise ValueError("private selection: no candidate")
        if unit not in (INSTANCE, CLIENT):
            raise ValueError(f"private selection: unit {unit!r} is neither {INSTANCE} nor {CLIENT}")
        expected_count(eta, gamma)  # η, γ in range
        self.name, self.scope, self.eta, self.gamma, self.unit = name, "study", float(eta), float(gamma), unit
        self.histories = [list(h) for h in histories]
        # no σ or q of its own: the Gaussian fields of the base class are not figures of this mechanism
        self.sigma = self.sample_rate = self.clip_norm = math.nan
        self.calibrated = False
        self.steps = self.planned_steps = max(sum(int(n) for _, _, n in h) for h in self.histories)

    def report(self) -> dict[str, object]:
        """Its own figures: η, γ, E[K], the candidates (no σ or q of its own)."""
        return {"scope": self.scope, "eta": self.eta, "gamma": self.gamma,
                "expected_runs": expected_count(self.eta, self.gamma), "candidates": len(self.histories)}  # fmt: skip

    def history(self, *, sample_rate: float | None = None):
        raise NotImplementedError("private selection is no subsampled Gaussian: its curve is Theorem 2's (rdp())")

    def rdp(self, orders=ORDERS, *, sample_rate: float | None = None) -> np.ndarray:
        """Theorem 2's curve at :data:`ORDERS` (the only orders its ε̂ minimisation is defined over here)."""
        if tuple(float(a) for a in orders) != ORDERS:
            raise ValueError("private selection's curve is computed at protocols.dp.private_selection.ORDERS")
        curve = np.max(np.stack([rdp_curve(h) for h in self.histories]), axis=0)
        return selection_rdp(curve, eta=self.eta, gamma=self.gamma)

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` (Opacus's conversion of :meth:`rdp`)."""
        return rdp_to_epsilon(self.rdp(), delta)

    def declaration(self) -> dict[str, object]:
        return {"kind": self.kind, "unit": self.unit, "channel": self.channel, "releases": list(self.releases),
                "noise_by": self.noise_by, "eta": self.eta, "gamma": self.gamma, "candidates": len(self.histories),
                "level": self.level}  # fmt: skip


def selection_epsilon(histories: list[list[tuple[float, float, int]]], *, delta: float, eta: float, gamma: float) -> float:
    """The ε (at δ) of the private selection among candidates with these (σ, q, steps) histories (one per candidate
    of the grid): the declared :class:`PrivateSelection`'s curve, converted."""
    return PrivateSelection(histories=histories, eta=eta, gamma=gamma).epsilon(delta)
