"""The f-DP one-run audit for Gaussian DP (Mahloujifar, Melis & Chaudhuri 2024) and the μ-GDP → (ε, δ) conversion.

Checked against: reference values of DeepMind's jax_privacy (tests/auditing_test.py, test_epsilon_one_run_close, at
commit 8967688c26d46f3b74bfdfe61ef1f984b887abab: 10,000 in- and 10,000 out-canary scores N(shift, 1) / N(0, 1) at
evenly spaced quantiles, one-sided guesses "in" above a threshold, significance 0.05 split over the thresholds of the
ROC's upper hull, δ = 1e-6: ε = 2.164749, 4.7218075, 9.133752 at shift 1, 2, 4); an independent, literal array
version of the recursion scanned on a μ grid; the exact binomial tail at μ = 0 (a perfectly private run); a Monte
Carlo coverage check on an exactly μ-GDP mechanism; and the conversion against a quadrature of the Gaussian privacy
loss distribution (δ(ε) = E[(1 − e^{ε − L})₊], L ~ N(μ²/2, μ²)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from tests.threat_models.test_one_run_audit import LOCAL, ROWS
from threat_models.attacks.one_run_audit import epsilon_lower_bound
from threat_models.one_run_fdp import epsilon_from_gdp, gdp_mu_lower_bound, gdp_mu_of_ledger, gdp_rejects


def _hull_counts(shift: float, n: int = 10_000) -> tuple[int, int, np.ndarray, np.ndarray]:
    """jax_privacy's test scores; (thresholds on the upper hull of the (FN, TN) counts, m, TP, FP) at each hull point."""
    q = np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)
    out, inn = stats.norm.ppf(q), stats.norm.ppf(q) + shift
    th = np.concatenate((np.union1d(inn, out), [np.inf]))
    fn, tn = np.searchsorted(np.sort(inn), th), np.searchsorted(np.sort(out), th)
    hull: list[int] = []
    for i in range(len(th)):  # monotone chain, dropping weakly dominated (collinear) points
        while len(hull) >= 2:
            (ax, ay), (bx, by) = (fn[hull[-2]], tn[hull[-2]]), (fn[hull[-1]], tn[hull[-1]])
            if (bx - ax) * (tn[i] - ay) - (by - ay) * (fn[i] - ax) >= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    h = np.asarray(hull)
    return len(h), 2 * n, n - fn[h], n - tn[h]


@pytest.mark.parametrize(
    ("shift", "expected", "hull", "r", "v"),
    [(1.0, 2.164749, 386, 406, 379), (2.0, 4.7218075, 374, 938, 934), (4.0, 9.133752, 140, 5436, 5436)],
)  # the (r, v) maximising μ over all hull thresholds (a full scan, 1-6 s each, done once); the test checks the max there
def test_matches_jax_privacy_reference_values(shift, expected, hull, r, v):
    n_hull, m, tp, fp = _hull_counts(shift)
    assert n_hull == hull and ((tp + fp == r) & (tp == v)).any()
    mu = gdp_mu_lower_bound(m=m, r=r, v=v, level=0.05 / n_hull)
    assert epsilon_from_gdp(mu, 1e-6) == pytest.approx(expected, rel=1e-5)


def _rejects_literal(m: int, r: int, v: int, mu: float, level: float) -> bool:
    """The recursion written out over arrays r[i], h[i] for every i (no early stop), for comparison."""
    rr, hh = np.zeros(v + 1), np.zeros(v + 1)
    rr[v], hh[v] = level * v / m, level * (r - v) / m
    for i in range(v - 1, -1, -1):
        hh[i] = max(hh[i + 1], stats.norm.cdf(stats.norm.ppf(rr[i + 1]) - mu))
        rr[i] = min(rr[i + 1] + i / (r - i) * (hh[i] - hh[i + 1]), 1.0)
    return rr[0] + hh[0] > r / m


@pytest.mark.parametrize(("m", "r", "v", "level"), [(1000, 100, 80, 0.05), (500, 200, 150, 0.01), (200, 40, 40, 0.05)])
def test_mu_bound_is_the_edge_of_the_rejected_grid(m, r, v, level):
    mu = gdp_mu_lower_bound(m=m, r=r, v=v, level=level)
    grid = np.arange(0.0, 8.0, 0.05)  # a coarse scan (the literal recursion is slow), then the edge at ±0.005
    rejected = [x for x in grid if _rejects_literal(m, r, v, x, level)]
    assert rejected and mu == pytest.approx(max(rejected), abs=0.0501)
    assert _rejects_literal(m, r, v, mu - 0.005, level) and not _rejects_literal(m, r, v, mu + 0.005, level)


@pytest.mark.parametrize("r", [10, 40, 100, 400])
def test_at_mu_zero_never_rejects_a_count_a_private_run_gives_with_probability_at_least_the_level(r):
    """μ = 0 is perfect privacy: the right guesses are Binomial(r, ½) exactly, so rejecting a v whose tail is ≥ level
    would be wrong."""
    for level in (0.05, 0.01):
        for v in range(r + 1):
            if stats.binom.sf(v - 1, r, 0.5) >= level:
                assert not gdp_rejects(m=2 * r, r=r, v=v, mu=0.0, level=level), (r, v, level)


def test_coverage_and_power_on_an_exactly_mu_gdp_mechanism():
    """Scores μ·b_i + N(0, 1): flipping one bit moves one score by μ, so the run is μ-GDP for each canary. At level
    0.05 the bound may exceed the true μ in at most ~5% of runs, and with 2000 canaries it gets most of the way."""
    rng = np.random.default_rng(0)
    mu_true, m, k, level, trials = 1.0, 2000, 200, 0.05, 200
    lbs = []
    for _ in range(trials):
        b = rng.random(m) < 0.5
        order = np.argsort(-(mu_true * b + rng.standard_normal(m)))
        v = int(b[order[:k]].sum() + (~b[order[m - k :]]).sum())
        lbs.append(gdp_mu_lower_bound(m=m, r=2 * k, v=v, level=level))
    lbs = np.asarray(lbs)
    assert (lbs > mu_true).mean() <= 0.08
    assert np.median(lbs) > 0.5 * mu_true


def test_monotone_in_the_right_guesses_and_the_conversion_in_mu_and_delta():
    mus = [gdp_mu_lower_bound(m=1000, r=200, v=v, level=0.05) for v in (100, 120, 140, 160, 180, 200)]
    assert mus[0] == 0.0 and all(a < b for a, b in zip(mus[1:], mus[2:], strict=False)) and mus[1] >= 0.0
    eps = [epsilon_from_gdp(mu, 1e-5) for mu in (0.1, 0.5, 1.0, 2.0, 4.0)]
    assert all(a < b for a, b in zip(eps, eps[1:], strict=False))
    assert epsilon_from_gdp(1.0, 1e-3) < epsilon_from_gdp(1.0, 1e-5) < epsilon_from_gdp(1.0, 1e-7)
    assert epsilon_from_gdp(0.0, 1e-5) == 0.0 and epsilon_from_gdp(1.0, 0.0) == math.inf


def _pld_delta(eps: float, mu: float) -> float:
    """δ(ε) of μ-GDP by quadrature of its privacy loss L ~ N(μ²/2, μ²): E[(1 − e^{ε − L})₊]."""
    f = lambda x: (1.0 - math.exp(eps - x)) * stats.norm.pdf(x, mu * mu / 2, mu)  # noqa: E731
    return integrate.quad(f, eps, mu * mu / 2 + 40 * mu, epsabs=1e-14, epsrel=1e-10, limit=200)[0]


@pytest.mark.parametrize(("mu", "delta"), [(0.5, 1e-5), (1.0, 1e-5), (2.0, 1e-6), (3.0, 0.05), (0.3, 0.1)])
def test_conversion_matches_a_quadrature_of_the_privacy_loss(mu, delta):
    eps = epsilon_from_gdp(mu, delta)
    assert eps > 0 and _pld_delta(eps, mu) == pytest.approx(delta, rel=1e-5)


def test_positive_where_steinkes_bound_is_zero():
    """The finding of the δ swamp (test_one_run_audit): at a client ledger's replacement δ 0.0298, 195 of 200 right
    gives Steinke et al. 0 whatever ε; the f-DP test has no δ term, so the same guesses reject μ-GDP up to μ 1.08
    (ε 2.06 at that δ)."""
    m, r, v, level, delta = 200, 200, 195, 0.01, 0.0298
    assert epsilon_lower_bound(m=m, r=r, v=v, delta=delta, level=level) == 0.0
    mu = gdp_mu_lower_bound(m=m, r=r, v=v, level=level)
    assert mu == pytest.approx(1.084, abs=1e-3) and epsilon_from_gdp(mu, delta) == pytest.approx(2.062, abs=1e-3)


def test_ledger_mu_only_for_full_batch_gaussians():
    assert gdp_mu_of_ledger([(2.0, 1.0, 4)]) == pytest.approx(1.0)
    assert gdp_mu_of_ledger([(2.0, 1.0, 4), (1.0, 1.0, 1)]) == pytest.approx(math.sqrt(2.0))
    assert gdp_mu_of_ledger([(2.0, 0.5, 4)]) is None and gdp_mu_of_ledger([]) is None
    assert gdp_mu_of_ledger([(2.0, 1.0, 4), (0.0, 1.0, 1)]) == math.inf  # a noiseless step: no Gaussian bound


def test_full_batch_dp_sgd_run_gdp_bound_above_steinkes_at_the_same_delta_and_below_the_accountant(tmp_path):
    """The private recipe's shape on synthetic data (one full-batch DP-SGD step, row canaries, noise-free replay) at
    ε = 4: its ledger is one Gaussian, so its exact μ is known. The GDP bound stays below the accountant's μ and ε and,
    at the audit's δ, is above Steinke et al.'s from the same guesses (0.32 here)."""
    from tests.threat_models.test_attacks import _audited

    _, res = _audited(tmp_path, *ROWS, "attacks.one_run_audit.reference=noise_free_replay",
                      f'privacy.local={{{LOCAL}, "target_epsilon": 4}}', attacks="one_run_audit")  # fmt: skip
    r = res["one_run_audit"]
    m, g = r["metrics"], r["details"]["gdp"]
    assert g["relation"] == "add/remove" and g["confidence"] == 0.95 and g["accountant_mu"] is not None
    assert 0.0 < m["gdp_mu_lower_bound"] <= g["accountant_mu"]
    assert 0.0 < m["epsilon_lower_bound_gdp"] <= float(m["relation_epsilon"]) and m["gdp_exceeds_accountant"] is False
    assert 3.9 < float(m["relation_epsilon"]) <= 4.0 + 1e-6
    assert g["epsilon_at_audit_delta"] > m["epsilon_lower_bound"] > 0.0, (g, m)
