"""Private hyperparameter selection (Papernot & Steinke, ICLR 2022, "Hyperparameter Tuning with Renyi Differential
Privacy"): the ε of releasing the best of a random number K of DP training runs.

The mechanism A: draw K from the truncated negative binomial distribution D_{η,γ} (η = 1: geometric, η = 0:
logarithmic), run Q (one candidate, drawn uniformly with replacement from a public grid, trained as an ordinary DP run)
K times, release only the best output by a score. Papernot & Steinke's **Theorem 2**: if Q is (λ, ε)-RDP and
(λ̂, ε̂)-RDP (λ > 1, λ̂ ≥ 1), η > −1 and γ ∈ (0, 1), then A is (λ, ε')-RDP with

    ε' = ε + (1 + η)(1 − 1/λ̂) ε̂ + (1 + η) log(1/γ) / λ̂ + log(E[K]) / (λ − 1),

    E[K] = η(1 − γ) / (γ(1 − γ^η))  (η ≠ 0),   E[K] = (1/γ − 1) / log(1/γ)  (η = 0; E[K] = 1/γ at η = 1).

Here Q's RDP curve is the maximum, order by order, of the grid candidates' curves (Q picks one of them at random; a
mixture's Rényi divergence is at most the largest of its parts'), each the sum over the run's mechanisms of Opacus's
subsampled-Gaussian RDP times its steps (:func:`rdp_curve`); ε̂ is the same curve at λ̂, minimised over λ̂ among the
orders for each λ; then Opacus's RDP → (ε, δ) conversion (``get_privacy_spent``), minimised over λ.

The theorem covers the released best output and nothing else: K, the unselected runs, their scores and the number
of runs must stay secret (releasing K voids it; so does redrawing after a failure: a second selection), and K must be
drawn by a secret RNG (:func:`draw_count` takes one; never the config seed). The Poisson variant (Theorem 6) is not
implemented here.
"""

from __future__ import annotations

import math
import random

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis

#: the Rényi orders of every curve here (Opacus's, as the ledgers use)
ORDERS = tuple(float(a) for a in RDPAccountant.DEFAULT_ALPHAS)


def rdp_curve(history: list[tuple[float, float, int]]) -> np.ndarray:
    """The RDP curve at :data:`ORDERS` of a (σ, q, steps) history: the sum of each entry's subsampled-Gaussian RDP."""
    out = np.zeros(len(ORDERS))
    for sigma, q, steps in history:
        if steps > 0:
            out = out + np.asarray(privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=ORDERS))
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


def selection_epsilon(histories: list[list[tuple[float, float, int]]], *, delta: float, eta: float, gamma: float) -> float:
    """The ε (at δ) of the private selection among candidates with these (σ, q, steps) histories (one per candidate
    of the grid): their curves' order-wise maximum, Theorem 2, the conversion."""
    if not histories:
        raise ValueError("no candidate")
    curve = np.max(np.stack([rdp_curve(h) for h in histories]), axis=0)
    return rdp_to_epsilon(selection_rdp(curve, eta=eta, gamma=gamma), delta)
