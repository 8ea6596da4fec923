"""The proven RDP bound of the Poisson-subsampled discrete Gaussian (:mod:`protocols.dp.discrete_gaussian_accounting`):
Zhu & Wang 2019's Theorem 6 over Canonne–Kamath–Steinke's curve, against Opacus, dp-accounting and a brute-force
Rényi divergence of the subsampled discrete Gaussian itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opacus.accountants.analysis import rdp as privacy_analysis

from protocols.dp.discrete_gaussian_accounting import (
    INTEGER_ORDERS,
    continuous_epsilon_at_integer_orders,
    discrete_gaussian_epsilon,
    discrete_gaussian_subsampled_rdp,
    poisson_subsampled_rdp,
)

POINTS = [(0.8, 0.01), (1.0, 0.1), (2.0, 0.5), (5.0, 0.9), (20.0, 0.1)]


@pytest.mark.parametrize(("sigma", "q"), POINTS)
def test_the_bound_is_at_least_opacus_tight_gaussian_rdp_at_every_integer_order(sigma, q):
    """(i) on the continuous Gaussian's curve the general bound is ≥ Opacus's exact subsampled-Gaussian RDP (it is an
    upper bound for every mechanism with that curve); equal at α = 2, where both are log(1 + q²(e^{1/σ²} − 1))."""
    orders = list(INTEGER_ORDERS)
    got = discrete_gaussian_subsampled_rdp(sigma, q, orders)
    tight = privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=orders)
    assert np.all(got >= tight * (1 - 1e-9))  # (Opacus's α = 2 differs from the closed form by ~1e-14)
    closed = math.log1p(q * q * math.expm1(1.0 / sigma**2))
    assert got[0] == pytest.approx(closed, rel=1e-12) and tight[0] == pytest.approx(closed, rel=1e-9)
    assert np.all(got <= np.array(orders) / (2 * sigma**2) * (1 + 1e-12))  # never above the unsampled curve
    assert np.all(np.diff(got) >= 0)  # non-decreasing in α, as every RDP curve


def test_the_bound_is_at_least_dp_accounting_rdp():
    """(ii) an independent implementation of the tight subsampled-Gaussian RDP (Google's dp-accounting)."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

    orders = list(range(2, 65))
    for sigma, q in POINTS:
        acc = rdp_acc.RdpAccountant(orders=orders)
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
        assert np.all(discrete_gaussian_subsampled_rdp(sigma, q, orders) >= np.asarray(acc._rdp) * (1 - 1e-9))


def _log_dg(s: float, ys: np.ndarray) -> np.ndarray:
    """log P(y) of N_Z(0, s²) on the integers ``ys`` (normalised over them; they cover ±40s)."""
    lp = -(ys.astype(float) ** 2) / (2 * s * s)
    return lp - (lp.max() + math.log(np.exp(lp - lp.max()).sum()))


def _renyi(lp: np.ndarray, lq: np.ndarray, a: int) -> float:
    t = a * lp + (1 - a) * lq
    m = t.max()
    return (m + math.log(np.exp(t - m).sum())) / (a - 1)


@pytest.mark.parametrize(("s", "q"), [(0.7, 0.3), (1.0, 0.1), (2.0, 0.5), (3.0, 0.05)])
def test_the_bound_covers_the_brute_force_divergence_of_the_subsampled_discrete_gaussian(s, q):
    """(iii) the mechanism itself: y = x·B + Z, Z ~ N_Z(0, s²), B ~ Bern(q), x ∈ {0, 1} (Δ = 1). Its Rényi
    divergences in both directions, summed over the integers ±40s, stay under the bound at σ = s."""
    ys = np.arange(-int(40 * s) - 2, int(40 * s) + 3)
    p = _log_dg(s, ys)
    shifted = np.concatenate([[-np.inf], p[:-1]])  # log P(y − 1)
    mix = np.logaddexp(math.log1p(-q) + p, math.log(q) + shifted)
    orders = list(range(2, 41))
    bound = discrete_gaussian_subsampled_rdp(s, q, orders)
    for i, a in enumerate(orders):
        worst = max(_renyi(mix, p, a), _renyi(p, mix, a))
        assert worst <= bound[i] * (1 + 1e-9), (a, worst, bound[i])


def test_the_general_theorem_on_a_known_curve_and_its_edges():
    """Theorem 6 by hand at α = 3 for a made-up curve; q = 0 is free, q = 1 is the base curve, σ = 0 is ∞; only
    integer orders ≥ 2 are accepted."""

    def eps(a):
        return 0.3 * a

    q = 0.2
    want = math.log((1 - q) ** 2 * (3 * q - q + 1) + 3 * q * q * (1 - q) * math.exp(eps(2))
                    + 3 * q**3 * math.exp(2 * eps(3))) / 2  # fmt: skip
    assert poisson_subsampled_rdp(eps, q, [3])[0] == pytest.approx(min(want, eps(3)), rel=1e-12)
    assert poisson_subsampled_rdp(eps, 0.0, [2, 5]).tolist() == [0.0, 0.0]
    assert poisson_subsampled_rdp(eps, 1.0, [2, 5]).tolist() == [eps(2), eps(5)]
    assert np.isinf(discrete_gaussian_subsampled_rdp(0.0, 0.5, [2])).all()
    with pytest.raises(ValueError, match="integer orders"):
        discrete_gaussian_subsampled_rdp(1.0, 0.1, [1.5])
    # τ (Kairouz–Liu–Steinke's correction for a sum of shares) raises the curve
    assert discrete_gaussian_subsampled_rdp(1.0, 0.1, [4], tau=0.01)[0] > discrete_gaussian_subsampled_rdp(1.0, 0.1, [4])[0]


def test_epsilon_of_a_history_against_the_continuous_value():
    """ε of a ledger history: at or above the continuous analysis at the same integer orders; equal without
    sampling (q = 1: the discrete Gaussian's curve is the continuous one, CKS 2020)."""
    hist = [(1.0, 0.1, 100), (20.0, 0.1, 100)]
    proven, cont = discrete_gaussian_epsilon(hist, 1e-5), continuous_epsilon_at_integer_orders(hist, 1e-5)
    assert proven >= cont
    full = [(3.0, 1.0, 10)]
    assert discrete_gaussian_epsilon(full, 1e-5) == pytest.approx(continuous_epsilon_at_integer_orders(full, 1e-5), rel=1e-9)
