"""The (ε, δ) of telling two Gaussians apart: the privacy profile of the pair (N(μ₁, s₁²), N(μ₀, s₀²)).

The canary-client estimate (:mod:`threat_models.attacks.canary_client_audit`, Andrew et al. 2024) fits one Gaussian to
the inserted canaries' cosines and one to the held-out ones and reports the ε of this pair at the run's δ. The
hockey-stick divergence δ_{P‖Q}(ε) = ∫ (p − e^ε·q)₊ = P[S] − e^ε·Q[S], S = {log p/q > ε}, is exact here: log p/q is a
quadratic in x, so S is a half-line, an interval or the complement of one, and P[S], Q[S] are normal CDFs. The pair's
δ(ε) is the larger of the two directions; ε(δ) the least ε ≥ 0 with δ(ε) ≤ δ (bisection: δ(ε) is non-increasing).
With equal variances it is the μ-GDP conversion with μ = |μ₁ − μ₀|/s (:func:`threat_models.one_run_fdp.epsilon_from_gdp`).
With unequal variances the log-ratio is unbounded in the tails, so the ε grows as δ → 0 even for equal means.
"""

from __future__ import annotations

import math

from scipy.stats import norm as normal


def _mass(mu: float, s: float, lo: float, hi: float) -> float:
    """N(μ, s²)'s mass on (lo, hi)."""
    if hi <= lo:
        return 0.0
    a, b = (lo - mu) / s, (hi - mu) / s
    if a > 0:  # in the upper tail: the survival functions keep their precision
        return float(normal.sf(a) - normal.sf(b))
    return float(normal.cdf(b) - normal.cdf(a))


def _region(eps: float, p: tuple[float, float], q: tuple[float, float]) -> list[tuple[float, float]]:
    """The intervals where log p/q > ε (p, q: (mean, std))."""
    (m1, s1), (m0, s0) = p, q
    a = 1.0 / (2 * s0**2) - 1.0 / (2 * s1**2)
    b = m1 / s1**2 - m0 / s0**2
    k = m0**2 / (2 * s0**2) - m1**2 / (2 * s1**2) + math.log(s0 / s1) - eps
    inf = math.inf
    if abs(a) < 1e-12 * max(1.0 / s0**2, 1.0 / s1**2):  # equal variances: linear in x
        if b == 0.0:
            return [(-inf, inf)] if k > 0 else []
        x = -k / b
        return [(x, inf)] if b > 0 else [(-inf, x)]
    disc = b * b - 4 * a * k
    if disc <= 0.0:
        return [(-inf, inf)] if a > 0 else []
    r = math.sqrt(disc)
    x1, x2 = sorted(((-b - r) / (2 * a), (-b + r) / (2 * a)))
    return [(-inf, x1), (x2, inf)] if a > 0 else [(x1, x2)]


def hockey_stick(eps: float, p: tuple[float, float], q: tuple[float, float]) -> float:
    """δ_{P‖Q}(ε) = P[S] − e^ε·Q[S] for P = N(p), Q = N(q) (p, q: (mean, std)), S = {log p/q > ε}."""
    region = _region(eps, p, q)
    pm = sum(_mass(*p, lo, hi) for lo, hi in region)
    qm = sum(_mass(*q, lo, hi) for lo, hi in region)
    return max(pm - math.exp(eps) * qm, 0.0)


def pair_delta(eps: float, p: tuple[float, float], q: tuple[float, float]) -> float:
    """The pair's δ(ε): the larger hockey-stick divergence of the two directions."""
    return max(hockey_stick(eps, p, q), hockey_stick(eps, q, p))


def pair_epsilon(p: tuple[float, float], q: tuple[float, float], delta: float) -> float:
    """The least ε ≥ 0 with the pair's δ(ε) ≤ ``delta`` (∞ if none up to 512: e^ε overflows a double past 709)."""
    if pair_delta(0.0, p, q) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while pair_delta(hi, p, q) > delta:
        lo, hi = hi, 2.0 * hi
        if hi > 512.0:
            return math.inf
    while hi - lo > 1e-9 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if pair_delta(mid, p, q) > delta:
            lo = mid
        else:
            hi = mid
    return hi
