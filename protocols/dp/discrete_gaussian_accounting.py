"""A proven RDP bound for the Poisson-subsampled discrete Gaussian: Canonne–Kamath–Steinke's bound for the base
mechanism, amplified by Zhu & Wang's general Poisson-subsampling theorem.

**Base mechanism.** The discrete Gaussian N_Z(0, σ²Δ²) added to an integer-valued query of L2 sensitivity Δ (every
release here is on a grid γ, so in grid units the neighbours' difference is an integer vector of norm ≤ (Δ + γ√d)/γ,
the std being σ times that) satisfies, at every order α > 1,

    ε(α) = α / (2σ²)                                              (Canonne, Kamath & Steinke, NeurIPS 2020, Thm 4/15)

— the continuous Gaussian's curve, i.e. ½σ^-2-zCDP. A secure sum of n discrete Gaussian *shares* N_Z(0, s²) is not
a discrete Gaussian; Kairouz, Liu & Steinke (ICML 2021, Thm 1 with Prop. 14) bound it by
ε(α) ≤ α/(2σ²) + τ·d with τ = 10·Σ_{k=1}^{n−1} exp(−2π²s²·k/(k+1)) (:func:`protocols.dp.discrete_gaussian.distributed_tau`);
``tau`` below is that additive τ·d.

**Poisson subsampling.** Opacus's subsampled-Gaussian RDP (Mironov, Talwar & Zhang 2019) is an exact computation for
the *continuous* Gaussian's likelihood ratio; it is not a theorem about the discrete one. Zhu & Wang, "Poisson
Subsampled Rényi Differential Privacy" (ICML 2019), Theorem 6, holds for *any* mechanism with RDP curve ε(·) at
integer orders: for integer α ≥ 2 and sampling probability q (add/remove neighbours; the base curve must bound the
divergence both ways, as α/(2σ²) does),

    ε_q(α) ≤ 1/(α−1) · log[ (1−q)^{α−1}(αq − q + 1) + C(α,2) q² (1−q)^{α−2} e^{ε(2)}
                            + 3 Σ_{ℓ=3}^{α} C(α,ℓ) (1−q)^{α−ℓ} q^ℓ e^{(ℓ−1)ε(ℓ)} ].

It is computed here in log space (log-binomials by lgamma, a log-sum-exp), capped by ε(α) itself (a Poisson
subsample of an (α, ε)-RDP mechanism is (α, ε)-RDP: joint convexity of e^{(α−1)D_α}), and replaced by its minimum
over the larger given orders (D_α is non-decreasing in α). At α = 2 it is
log(1 + q²(e^{ε(2)} − 1)), the exact subsampled Gaussian's value; at larger orders the factor 3 makes it an upper
bound of Opacus's (tested at every integer order 2..256).

**(ε, δ).** Steps compose by adding RDP curves; the conversion is Opacus's ``get_privacy_spent`` over the integer
orders 2..256 (:data:`INTEGER_ORDERS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

import numpy as np
from opacus.accountants.analysis import rdp as privacy_analysis

#: the orders the proven bound is evaluated at (Theorem 6 holds at integer orders only)
INTEGER_ORDERS: tuple[int, ...] = tuple(range(2, 257))


def _log_binom(n: int, k: np.ndarray) -> np.ndarray:
    return math.lgamma(n + 1) - np.array([math.lgamma(j + 1) + math.lgamma(n - j + 1) for j in k])


def _check_orders(orders: Iterable) -> list[int]:
    out = []
    for a in orders:
        if not (float(a) == int(a) and int(a) >= 2):
            raise ValueError(f"the Poisson-subsampled bound holds at integer orders α ≥ 2, not {a}")
        out.append(int(a))
    return out


def poisson_subsampled_rdp(base_rdp: Callable[[int], float], q: float, orders: Iterable) -> np.ndarray:
    """Zhu & Wang 2019, Theorem 6: the RDP of the Poisson subsample (rate ``q``) of any mechanism whose RDP at
    integer order ℓ is ``base_rdp(ℓ)``, at each integer order in ``orders`` (α ≥ 2), in log space, capped by the base
    curve."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate q must be in [0, 1], not {q}")
    alphas = _check_orders(orders)
    out = np.empty(len(alphas))
    for i, a in enumerate(alphas):
        base = float(base_rdp(a))
        if q == 0.0:
            out[i] = 0.0
            continue
        if q == 1.0 or math.isinf(base):
            out[i] = base
            continue
        lq, l1q = math.log(q), math.log1p(-q)
        terms = [(a - 1) * l1q + math.log1p((a - 1) * q)]  # (1−q)^{α−1}(αq − q + 1)
        terms.append(_log_binom(a, np.array([2]))[0] + 2 * lq + (a - 2) * l1q + float(base_rdp(2)))
        if a >= 3:
            ell = np.arange(3, a + 1)
            eps = np.array([float(base_rdp(int(j))) for j in ell])
            terms.extend(math.log(3.0) + _log_binom(a, ell) + (a - ell) * l1q + ell * lq + (ell - 1) * eps)
        t = np.array(terms)
        m = float(t.max())
        log_sum = m + math.log(float(np.exp(t - m).sum()))
        out[i] = min(base, log_sum / (a - 1))
    # RDP is non-decreasing in α, so ε(α) ≤ the bound at any larger order: the suffix minimum over the given orders
    order = np.argsort(alphas)
    out[order] = np.minimum.accumulate(out[order][::-1])[::-1]
    return out


@lru_cache(maxsize=4096)
def _curve(sigma: float, q: float, tau: float, orders: tuple[int, ...]) -> tuple[float, ...]:
    def base(a: int) -> float:
        return a / (2.0 * sigma * sigma) + tau

    return tuple(poisson_subsampled_rdp(base, q, orders))


def discrete_gaussian_subsampled_rdp(sigma: float, q: float, orders: Sequence = INTEGER_ORDERS, tau: float = 0.0) -> np.ndarray:
    """The proven RDP curve of one Poisson-subsampled (rate ``q``) discrete Gaussian step with noise multiplier
    ``sigma`` (std over the integer sensitivity), at the integer ``orders``: Zhu–Wang's Theorem 6 over the base
    curve α/(2σ²) + ``tau`` (CKS 2020; ``tau`` = Kairouz–Liu–Steinke's τ·d for a sum of shares, 0 for one draw).
    σ = 0: ∞ at every order."""
    if not (sigma >= 0.0 and math.isfinite(sigma)) or not (tau >= 0.0 and math.isfinite(tau)):
        raise ValueError(f"σ {sigma} and τ {tau} must be finite and ≥ 0")
    orders = tuple(_check_orders(orders))
    if sigma == 0.0:
        return np.full(len(orders), math.inf) if q > 0 else np.zeros(len(orders))
    return np.array(_curve(float(sigma), float(q), float(tau), orders))


def discrete_gaussian_epsilon(
    history: Iterable[tuple[float, float, int]], delta: float, tau: float = 0.0, orders: Sequence = INTEGER_ORDERS
) -> float:
    """ε at ``delta`` of a ledger history [(σ, q, steps), …] of discrete Gaussian steps under the proven bound: the
    steps' curves (:func:`discrete_gaussian_subsampled_rdp`, ``tau`` per step) added, then Opacus's
    ``get_privacy_spent`` over the integer orders."""
    orders = tuple(_check_orders(orders))
    rdp = np.zeros(len(orders))
    for sigma, q, steps in history:
        if steps:
            rdp = rdp + int(steps) * discrete_gaussian_subsampled_rdp(sigma, q, orders, tau)
    if not np.isfinite(rdp).any():
        return math.inf
    eps, _ = privacy_analysis.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


def continuous_epsilon_at_integer_orders(history: Iterable[tuple[float, float, int]], delta: float,
                                         orders: Sequence = INTEGER_ORDERS) -> float:  # fmt: skip
    """The same history's ε under Opacus's continuous subsampled-Gaussian RDP at the same integer orders (for a
    like-for-like comparison with :func:`discrete_gaussian_epsilon`)."""
    orders = list(_check_orders(orders))
    rdp = np.zeros(len(orders))
    for sigma, q, steps in history:
        if steps:
            rdp = rdp + privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=int(steps), orders=orders)
    eps, _ = privacy_analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    return float(eps)


__all__ = [
    "INTEGER_ORDERS", "continuous_epsilon_at_integer_orders", "discrete_gaussian_epsilon",
    "discrete_gaussian_subsampled_rdp", "poisson_subsampled_rdp",
]  # fmt: skip
