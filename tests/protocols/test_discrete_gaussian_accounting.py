"""The Poisson-subsampled discrete Gaussian's RDP (:mod:`protocols.dp.discrete_gaussian_accounting`): the theorem's
two steps against brute-force lattice sums (the remove direction equals Mironov–Talwar–Zhang's integer-order value;
the add direction is below it for symmetric pairs, and not for an asymmetric one), the curve against Opacus and
dp-accounting, the ledger wired to it, and Zhu & Wang's general (looser) bound."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from opacus.accountants.analysis import rdp as privacy_analysis
from scipy.special import logsumexp

from protocols.dp.accountant import RDP_ORDERS, epsilon_of
from protocols.dp.accountants.rdp import rdp_curve
from protocols.dp.discrete_gaussian import distributed_tau
from protocols.dp.discrete_gaussian_accounting import (
    LEDGER_ORDERS,
    continuous_epsilon,
    discrete_gaussian_epsilon,
    discrete_gaussian_subsampled_rdp,
    poisson_subsampled_rdp,
    zhu_wang_discrete_gaussian_rdp,
)
from protocols.dp.mechanisms import LabelSetWStep

POINTS = [(0.8, 0.01), (1.0, 0.1), (2.0, 0.5), (5.0, 0.9), (20.0, 0.1)]
ORDERS_TO_256 = list(range(2, 257))


def _mtz_log_a(r2_over_s2: float, q: float, a: int) -> float:
    """log Σ_l C(a,l)(1−q)^{a−l} q^l exp(l(l−1)·r²/(2s²)), written out independently of the module."""
    terms = [math.log(math.comb(a, k)) + (a - k) * math.log1p(-q) + k * math.log(q) + k * (k - 1) * r2_over_s2 / 2
             for k in range(a + 1)]  # fmt: skip
    return float(logsumexp(terms))


def _lattice(s: float, v: tuple[int, ...], amax: int) -> tuple[np.ndarray, np.ndarray]:
    """Every point x of the box ∏[−M_i, M_i] (M_i = amax·|v_i| + 40s + 2, past the mass of P0·L^l for l ≤ amax and of
    P0·L^{1−l}) of Z^d: log P0(x) for P0 = N_Z(0, s²I) normalised over the box, and log L(x) = log P1(x)/P0(x)."""
    axes = [np.arange(-(amax * abs(c) + int(40 * s) + 2), amax * abs(c) + int(40 * s) + 3) for c in v]
    x = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1).astype(float)
    lp0 = -(x**2).sum(axis=1) / (2 * s * s)
    lp0 -= logsumexp(lp0)
    lp1 = -((x - np.asarray(v, dtype=float)) ** 2).sum(axis=1) / (2 * s * s)
    lp1 -= logsumexp(lp1)
    return lp0, lp1 - lp0


def _log_ab(lp0: np.ndarray, log_l: np.ndarray, q: float, a: int) -> tuple[float, float]:
    """log A_α = log E_P0[X^α] (remove) and log B_α = log E_P0[X^{1−α}] (add), X = 1 − q + qL, as plain sums."""
    lx = log_l if q == 1.0 else np.logaddexp(math.log1p(-q), math.log(q) + log_l)
    return float(logsumexp(lp0 + a * lx)), float(logsumexp(lp0 + (1 - a) * lx))


# several integer v of one norm in d = 1, 2, 3 (the identity says A_α depends on ‖v‖ only), at two noise levels in d ≤ 2
CASES = [(v, s) for v in [(3,), (5, 0), (3, 4)] for s in (0.7, 1.3)] + [((3, 0, 0), 0.7), ((2, 2, 1), 0.7), ((1, 1, 1), 0.7)]


@pytest.mark.parametrize(("v", "s"), CASES)
def test_remove_direction_equals_the_continuous_integer_order_value_and_add_is_below(v, s):
    """Steps 1 and 2 of the theorem on brute-force lattice sums: A_α over Z^d equals MTZ's continuous value at ‖v‖/s
    (to 1e-10 relative; the sums are float64 log-sum-exps), and B_α ≤ A_α, with equality only at q = 1."""
    amax = 5 if len(v) == 3 else 12
    lp0, log_l = _lattice(s, v, amax)
    r2 = sum(c * c for c in v) / s**2
    for q, a in itertools.product([0.01, 0.1, 0.5, 1.0], range(2, amax + 1)):
        log_a, log_b = _log_ab(lp0, log_l, q, a)
        want = a * (a - 1) * r2 / 2 if q == 1.0 else _mtz_log_a(r2, q, a)
        assert log_a == pytest.approx(want, rel=1e-10, abs=1e-14), (q, a)
        if q < 1.0:
            assert log_b < log_a, (q, a)
        else:  # L ↦ 1/L under the reflection: the two directions coincide
            assert log_b == pytest.approx(log_a, rel=1e-10), a
    # the module's curve is that value at σ = s/‖v‖ (noise std over the sensitivity); at fractional orders it is above
    # both directions' lattice sums (the log-convex interpolation; at q = 1 CKS's α/(2σ²))
    sigma = s / math.sqrt(sum(c * c for c in v))
    fractional = [1.1, 1.5, 2.5, 3.3, amax - 0.5]
    for q in [0.01, 0.5, 1.0]:
        curve = discrete_gaussian_subsampled_rdp(sigma, q, range(2, amax + 1))
        want = [_log_ab(lp0, log_l, q, a)[0] / (a - 1) for a in range(2, amax + 1)]
        np.testing.assert_allclose(curve, want, rtol=1e-9, atol=1e-15)
        above = discrete_gaussian_subsampled_rdp(sigma, q, fractional)
        for a, bound in zip(fractional, above, strict=True):
            log_a, log_b = _log_ab(lp0, log_l, q, a)
            assert log_b <= log_a + 1e-12 and log_a / (a - 1) <= bound * (1 + 1e-9), (q, a)
            if q == 1.0:  # CKS's α/(2σ²): equal at integer α, ≤ otherwise (lv off the lattice), close here
                assert log_a / (a - 1) >= bound * (1 - 1e-3)


def test_at_a_fractional_order_the_continuous_value_does_not_cover_the_discrete_gaussian():
    """Why the fractional orders are interpolated: at α = 1.1, q = 0.01, v = 3, s = 0.7 (σ = 0.233) the discrete
    Gaussian's remove direction, summed over the integers, is 0.069301, above Opacus's continuous value 0.069018 (an
    mpmath quadrature of the continuous integral agrees with Opacus to 1e-11); the module's value covers it."""
    lp0, log_l = _lattice(0.7, (3,), 12)
    log_a, _ = _log_ab(lp0, log_l, 0.01, 1.1)
    continuous = privacy_analysis.compute_rdp(q=0.01, noise_multiplier=0.7 / 3, steps=1, orders=[1.1])[0]
    assert log_a / 0.1 == pytest.approx(0.069301214, rel=1e-6) and continuous == pytest.approx(0.069018283, rel=1e-6)
    assert log_a / 0.1 > continuous * 1.004
    assert log_a / 0.1 <= discrete_gaussian_subsampled_rdp(0.7 / 3, 0.01, [1.1])[0]


def test_step_2_holds_for_symmetric_pairs_and_fails_without_symmetry():
    """Step 2 uses only the reflection: B_α ≤ A_α for a sum of discrete Gaussian shares (symmetric, not a discrete
    Gaussian) and for randomized response, at real orders too; for an asymmetric pair the add direction is larger."""
    ys = np.arange(-60, 61)
    share = np.exp(-(ys.astype(float) ** 2) / (2 * 0.5**2))
    share /= share.sum()
    total = np.convolve(np.convolve(share, share), share)  # 3 shares of N_Z(0, 0.25), on −180..180
    lp0 = np.log(np.maximum(total, 1e-300))
    lp1 = np.concatenate([[-np.inf] * 2, lp0[:-2]])  # shifted by v = 2
    keep = slice(2, -2)
    rr = (np.log([0.2, 0.8]), np.log([0.8 / 0.2, 0.2 / 0.8]))  # randomized response: P0 = (.2, .8), P1 = (.8, .2)
    for (p0, log_l), q, a in itertools.product([(lp0[keep], (lp1 - lp0)[keep]), rr], [0.05, 0.3, 0.9], [1.5, 2, 3.7, 8, 20]):
        log_a, log_b = _log_ab(p0, log_l, q, a)
        assert log_b <= log_a + 1e-12, (q, a)
    asym = (np.log([0.5, 0.5]), np.log([0.999 / 0.5, 0.001 / 0.5]))
    log_a, log_b = _log_ab(*asym, 0.9, 8)
    assert log_b > log_a + 5  # (B/A > e^5: without the symmetry the add direction is not dominated)


def test_the_sum_of_shares_bound_covers_its_brute_force_divergence():
    """τ > 0: three shares N_Z(0, 0.5²) (τ = 1.22, far from negligible), v = 1. Both directions of the subsampled sum,
    summed over the integers, stay under the curve at σ = √3·0.5 with Kairouz–Liu–Steinke's τ; τ = 0 would not
    cover them (the sum is not a discrete Gaussian)."""
    ys = np.arange(-150, 151)
    share = np.exp(-(ys.astype(float) ** 2) / 0.5)
    share /= share.sum()
    lp0 = np.log(np.maximum(np.convolve(np.convolve(share, share), share), 1e-300))
    lp1 = np.concatenate([[-np.inf], lp0[:-1]])
    p0, log_l = lp0[1:-1], (lp1 - lp0)[1:-1]
    tau, sigma = distributed_tau(0.5, 3), math.sqrt(3) * 0.5
    orders = list(range(2, 21))
    exceeds_tau0 = False
    for q in [0.1, 0.5]:
        bound = discrete_gaussian_subsampled_rdp(sigma, q, orders, tau=tau)
        plain = discrete_gaussian_subsampled_rdp(sigma, q, orders)
        for i, a in enumerate(orders):
            log_a, log_b = _log_ab(p0, log_l, q, a)
            assert max(log_a, log_b) / (a - 1) <= bound[i] * (1 + 1e-9), (q, a)
            exceeds_tau0 |= log_a / (a - 1) > plain[i] * (1 + 1e-6)
    assert exceeds_tau0


@pytest.mark.parametrize(("sigma", "q"), POINTS)
def test_the_curve_is_opacus_integer_order_value(sigma, q):
    """At every integer order 2..256 the curve is Opacus's subsampled-Gaussian RDP (to 1e-9; Opacus's sums are in
    float64 too), and it stays finite past Opacus's float range (α = 8192, where its binomials overflow to nan)."""
    got = discrete_gaussian_subsampled_rdp(sigma, q, ORDERS_TO_256)
    tight = privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=ORDERS_TO_256)
    np.testing.assert_allclose(got, tight, rtol=1e-9)
    closed = math.log1p(q * q * math.expm1(1.0 / sigma**2))  # α = 2
    assert got[0] == pytest.approx(closed, rel=1e-12)
    top = discrete_gaussian_subsampled_rdp(sigma, q, [8192])[0]
    assert math.isfinite(top) and top <= 8192 / (2 * sigma**2) and top >= got[-1]


def test_the_curve_is_dp_accounting_rdp():
    """An independent implementation of the subsampled Gaussian's RDP (Google's dp-accounting), integer orders."""
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

    orders = list(range(2, 65))
    for sigma, q in POINTS:
        acc = rdp_acc.RdpAccountant(orders=orders)
        acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)))
        np.testing.assert_allclose(discrete_gaussian_subsampled_rdp(sigma, q, orders), np.asarray(acc._rdp), rtol=1e-9)


def test_the_ledger_is_the_theorem():
    """The ledger's one-step curve and the declared mechanisms' curves are the theorem's, over the ledger's orders:
    Opacus's value at every integer order (finite where Opacus's float sums give nan, α ≥ 1536) and at every order
    when q = 1; at least Opacus's continuous value at the fractional orders. ε of a history is
    :func:`discrete_gaussian_epsilon`."""
    assert RDP_ORDERS == LEDGER_ORDERS
    integer = np.array([float(a).is_integer() for a in RDP_ORDERS])
    for sigma, q in [*POINTS, (1.0, 1.0)]:
        curve = rdp_curve(sigma, q)
        np.testing.assert_array_equal(curve, discrete_gaussian_subsampled_rdp(sigma, q, RDP_ORDERS))
        opacus = privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(RDP_ORDERS))
        finite = np.isfinite(opacus)
        assert np.all(np.isfinite(curve)) and (q == 1.0 or not finite[-1])
        np.testing.assert_allclose(curve[integer & finite], opacus[integer & finite], rtol=1e-9)
        assert np.all(curve[~integer] >= opacus[~integer] * (1 - 1e-12))
        if q == 1.0:
            np.testing.assert_allclose(curve, opacus, rtol=1e-12)
        m = LabelSetWStep(name="w", sigma=sigma, sample_rate=q, steps=7)
        np.testing.assert_allclose(m.rdp(RDP_ORDERS), 7 * curve, rtol=1e-12)
    hist = [(1.484, 0.1, 100), (20.0, 0.1, 3)]
    assert epsilon_of(hist, 1e-5, "rdp") == pytest.approx(discrete_gaussian_epsilon(hist, 1e-5), rel=1e-12)
    # at a fractional order the continuous value is below the lattice's (v = 1, σ 0.5, q 0.01, α 1.5: the exact
    # lattice divergence is 0.0026737, Opacus's 0.0026299): the ledger must sit strictly above Opacus there
    at = RDP_ORDERS.index(1.5)
    ledger, cont = rdp_curve(0.5, 0.01)[at], privacy_analysis.compute_rdp(q=0.01, noise_multiplier=0.5, steps=1, orders=[1.5])[0]
    assert ledger >= 0.0026737 * (1 - 1e-4) > cont


def test_epsilon_beside_the_continuous_analysis():
    """Bibtex's W step (σ 1.484, q 0.1, 100 steps, δ 1e-5): the proven ε 4.009 is 0.5% above the continuous analysis
    with Opacus's fractional orders (3.990), and far below Zhu–Wang's 5.37. Without sampling (q = 1) the curves are
    CKS's α/(2σ²) at every order, and the two agree."""
    hist = [(1.484, 0.1, 100)]
    proven, cont = discrete_gaussian_epsilon(hist, 1e-5), continuous_epsilon(hist, 1e-5)
    assert proven == pytest.approx(4.0088, abs=1e-3) and cont == pytest.approx(3.9895, abs=1e-3)
    assert proven >= cont
    full = [(3.0, 1.0, 10)]
    assert discrete_gaussian_epsilon(full, 1e-5) == pytest.approx(continuous_epsilon(full, 1e-5), rel=1e-12)


@pytest.mark.parametrize(("sigma", "q"), POINTS)
def test_zhu_wang_bound_is_above_the_theorem(sigma, q):
    """Zhu & Wang's Theorem 6 over CKS's curve holds for mechanisms without the symmetry: at every integer order it is
    ≥ the theorem's curve (its factor 3), equal at α = 2, and ≤ the unsampled curve; with τ too."""
    zw = zhu_wang_discrete_gaussian_rdp(sigma, q, ORDERS_TO_256)
    exact = discrete_gaussian_subsampled_rdp(sigma, q, ORDERS_TO_256)
    assert np.all(zw >= exact * (1 - 1e-9)) and zw[0] == pytest.approx(exact[0], rel=1e-9)  # (ZW's sum: 1e-12)
    assert np.all(zw <= np.array(ORDERS_TO_256) / (2 * sigma**2) * (1 + 1e-12)) and np.all(np.diff(zw) >= 0)
    tau = 0.01
    with_tau = discrete_gaussian_subsampled_rdp(sigma, q, ORDERS_TO_256, tau=tau)
    zw_tau = zhu_wang_discrete_gaussian_rdp(sigma, q, ORDERS_TO_256, tau)
    assert np.all(with_tau >= exact) and np.all(with_tau <= zw_tau * (1 + 1e-12))


def test_the_general_theorem_on_a_known_curve_and_its_edges():
    """Theorem 6 by hand at α = 3 for a made-up curve; q = 0 is free, q = 1 is the base curve, σ = 0 is ∞; Zhu–Wang
    takes integer orders ≥ 2 only, the theorem's curve real orders > 1."""

    def eps(a):
        return 0.3 * a

    q = 0.2
    want = math.log((1 - q) ** 2 * (3 * q - q + 1) + 3 * q * q * (1 - q) * math.exp(eps(2))
                    + 3 * q**3 * math.exp(2 * eps(3))) / 2  # fmt: skip
    assert poisson_subsampled_rdp(eps, q, [3])[0] == pytest.approx(min(want, eps(3)), rel=1e-12)
    assert poisson_subsampled_rdp(eps, 0.0, [2, 5]).tolist() == [0.0, 0.0]
    assert poisson_subsampled_rdp(eps, 1.0, [2, 5]).tolist() == [eps(2), eps(5)]
    assert np.isinf(discrete_gaussian_subsampled_rdp(0.0, 0.5, [2])).all()
    assert discrete_gaussian_subsampled_rdp(1.0, 0.0, [2, 9]).tolist() == [0.0, 0.0]
    assert discrete_gaussian_subsampled_rdp(2.0, 1.0, [2, 9]).tolist() == [2 / 8, 9 / 8]
    with pytest.raises(ValueError, match="integer orders"):
        zhu_wang_discrete_gaussian_rdp(1.0, 0.1, [1.5])
    with pytest.raises(ValueError, match="finite and > 1"):
        discrete_gaussian_subsampled_rdp(1.0, 0.1, [1.0])
    with pytest.raises(ValueError, match="sampling rate"):
        discrete_gaussian_subsampled_rdp(1.0, 1.5, [2])
