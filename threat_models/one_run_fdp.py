"""The f-DP one-run audit for Gaussian DP (Mahloujifar, Melis & Chaudhuri 2024, "Auditing f-Differential Privacy in
One Run", arXiv:2410.22235), and the (ε, δ) a μ-GDP claim implies (Dong, Roth & Su 2019, Cor. 2.13).

The game is Steinke et al.'s: m canaries, each inserted with probability ½; the auditor guesses on c of them and v
guesses are right. Pick a canary I uniformly at random and, for each count i, let r_i and h_i be the probabilities
that I is guessed right, resp. wrong, *and* at least i guesses are right. Then r_0 + h_0 = c/m (every run guesses c
times), and adding the outcomes with exactly i right guesses adds i right and c − i wrong guesses, so
r_i − r_{i+1} = i/(c − i)·(h_i − h_{i+1}). Under f-DP for each canary, flipping I's bit turns a right guess into a
wrong one, so h_i ≥ f̄⁻¹(r_{i+1}); for μ-GDP, f̄⁻¹(x) = Φ(Φ⁻¹(x) − μ). If P[≥ v right] were ≥ τ, then r_v ≥ τ·v/m and
h_v ≥ τ·(c − v)/m, and running the recursion down to i = 0 gives the least r_0 + h_0 these constraints allow: if it
exceeds c/m the claim is contradicted, so μ-GDP is rejected at level τ (the paper's audit with recursive hypotheses
and the cap r ≤ 1). The rejected μ form an interval [0, μ*): the bound is μ*, found by bisection.

Unlike Steinke et al.'s bound, no δ enters the test: for a mechanism whose trade-off curve is Gaussian (a full-batch
Gaussian sum, and compositions of those), the whole privacy profile follows from μ, and the ε at any δ is the exact
conversion δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2). For other mechanisms (Poisson-subsampled DP-SGD) the ε from
μ* is an estimate under the Gaussian-profile assumption, not a lower bound on their (ε, δ).
"""

from __future__ import annotations

import math

from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr, ndtri


def gdp_rejects(*, m: int, r: int, v: int, mu: float, level: float) -> bool:
    """Whether v right guesses of r (m canaries) reject μ-GDP per canary at ``level`` (the recursion above)."""
    if r == 0 or v == 0:
        return False
    right, wrong = level * v / m, level * (r - v) / m
    for i in range(v - 1, -1, -1):
        floor = float(ndtr(ndtri(right) - mu)) if 0.0 < right < 1.0 else (0.0 if right <= 0.0 else 1.0)
        if floor <= wrong:  # the constraint no longer binds: neither quantity moves again
            break
        right = min(right + i / (r - i) * (floor - wrong), 1.0)
        wrong = floor
    return right + wrong > r / m


def gdp_mu_lower_bound(*, m: int, r: int, v: int, level: float, tol: float = 1e-7) -> float:
    """The largest μ whose μ-GDP v right guesses of r reject at ``level`` (0 if none; capped at 64)."""
    if not gdp_rejects(m=m, r=r, v=v, mu=0.0, level=level):
        return 0.0
    lo, hi = 0.0, 1.0
    while gdp_rejects(m=m, r=r, v=v, mu=hi, level=level):
        lo, hi = hi, 2.0 * hi
        if hi > 64.0:
            return lo
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if gdp_rejects(m=m, r=r, v=v, mu=mid, level=level):
            lo = mid
        else:
            hi = mid
    return lo


def gdp_log_delta(eps: float, mu: float) -> float:
    """log δ(ε) of μ-GDP: δ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2), in the log domain (−∞ for μ = 0)."""
    if mu <= 0.0:
        return -math.inf
    a = float(log_ndtr(-eps / mu + mu / 2.0))
    b = eps + float(log_ndtr(-eps / mu - mu / 2.0))
    if b >= a:
        return -math.inf
    return a + math.log1p(-math.exp(b - a))


def epsilon_from_gdp(mu: float, delta: float) -> float:
    """The least ε with μ-GDP ⇒ (ε, δ)-DP (the exact conversion; ∞ for δ ≤ 0 and μ > 0; 0 for μ = 0)."""
    if mu <= 0.0:
        return 0.0
    if delta >= 1.0:
        return 0.0
    if delta <= 0.0:
        return math.inf
    target = math.log(delta)
    if gdp_log_delta(0.0, mu) <= target:
        return 0.0
    hi = 1.0
    while gdp_log_delta(hi, mu) > target:
        hi *= 2.0
        if hi > 1e6:
            return math.inf
    return float(brentq(lambda e: gdp_log_delta(e, mu) - target, 0.0, hi, xtol=1e-10, rtol=1e-12))


def ledger_history(report: dict) -> list[tuple[float, float, int]]:
    """The (σ, q, steps) of each mechanism of a privacy unit's report (its ledger composes them)."""
    mechs = report.get("mechanisms") or {"": report}
    return [(float(x["noise_multiplier"]), float(x["sample_rate"]), int(x["steps"])) for x in mechs.values() if int(x["steps"])]


def gdp_mu_of_ledger(history) -> float | None:
    """The exact μ of a ledger of full-batch Gaussian mechanisms (every q = 1): √(Σ steps/σ²) under add/remove;
    None when any mechanism is subsampled (its trade-off curve is then not Gaussian); ∞ with a noiseless one (σ = 0)."""
    if not history or any(q < 1.0 for _, q, _ in history):
        return None
    if any(sigma == 0.0 for sigma, _, _ in history):
        return math.inf
    return math.sqrt(sum(steps / sigma**2 for sigma, _, steps in history))
