"""The group bound (protocols/dp/group_bound.py) against independent computations: the Gaussian's closed form where
every client is sampled, and, under Poisson sampling, numerical quadrature of the Rényi divergence of the worst 1-D
pair of mixtures it must bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from protocols.dp.group_bound import cohort_count_logpmf, cohort_count_pmf, gaussian_rdp, group_substitution_rdp

ORDERS = [1.5, 2.0, 3.0, 5.0, 8.0, 16.0]


@pytest.mark.parametrize("group", [1, 2, 3, 5])
@pytest.mark.parametrize("sigma", [0.8, 2.0, 11.6])
def test_every_client_sampled_is_the_gaussian_at_twice_the_group(group, sigma):
    """q = 1: every member sampled, the sum moves by 2C per member: α(2g)²/(2σ²), the Gaussian's closed form."""
    got = group_substitution_rdp(sigma, cohort_count_logpmf(group, sample_rate=1.0), ORDERS)
    want = [a * (2 * group) ** 2 / (2 * sigma**2) for a in ORDERS]
    assert got == pytest.approx(want, rel=1e-12)
    assert gaussian_rdp(2 * group / sigma, ORDERS) == pytest.approx(want, rel=1e-12)


def _mixture_renyi(alpha: float, sigma: float, q: float, group: int, *, sign: int) -> float:
    """D_α(P‖Q) by numerical integration (a fine grid, in log space) for the 1-D pair P = Σ_j w_j N(jC, σ²C²),
    Q = Σ_j w_j N(−jC, σ²C²) (C = 1): each sampled member's clipped update flips from +C to −C, the largest
    substitution (2C), all aligned."""
    logw = np.log(stats.binom.pmf(np.arange(group + 1), group, q))
    span = sigma * (14 + 4 * alpha) + 4 * group * alpha
    x = np.linspace(-span, span, 100_001)
    j = np.arange(group + 1)[:, None]
    logp = special.logsumexp(logw[:, None] + stats.norm.logpdf(x[None, :], sign * j, sigma), axis=0)
    logq = special.logsumexp(logw[:, None] + stats.norm.logpdf(x[None, :], -sign * j, sigma), axis=0)
    log_integral = special.logsumexp(alpha * logp + (1 - alpha) * logq) + math.log(x[1] - x[0])
    return float(log_integral) / (alpha - 1)


@pytest.mark.parametrize(("sigma", "q", "group"), [(1.0, 0.5, 1), (2.0, 0.5, 3), (5.918, 0.5, 3), (3.0, 0.1, 2)])
def test_the_bound_holds_for_the_worst_aligned_substitution(sigma, q, group):
    """At every order, the bound is at least the Rényi divergence of the worst aligned substitution (both directions),
    and within a factor that shows it is not vacuous (it keeps the cost of the rounds without any member sampled)."""
    bound = group_substitution_rdp(sigma, cohort_count_logpmf(group, sample_rate=q), ORDERS)
    for a, b in zip(ORDERS, bound, strict=True):
        for sign in (1, -1):
            exact = _mixture_renyi(a, sigma, q, group, sign=sign)
            assert exact <= b * (1 + 1e-9) + 1e-12, (a, exact, b)
    # and it amplifies: below the unsampled Gaussian at the same group
    assert np.all(bound < gaussian_rdp(2 * group / sigma, ORDERS))


def test_a_fixed_cohort_counts_members_hypergeometrically():
    pmf = cohort_count_pmf(3, sample_rate=0.25, population=20, cohort=5)
    assert pmf == pytest.approx(stats.hypergeom.pmf(np.arange(4), 20, 3, 5))
    assert pmf.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="population"):
        cohort_count_pmf(3, sample_rate=0.25, cohort=5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="group size"):
        cohort_count_pmf(0, sample_rate=0.5)
    with pytest.raises(ValueError, match="positive"):
        group_substitution_rdp(0.0, np.log([0.5, 0.5]), ORDERS)
    with pytest.raises(ValueError, match="exceed 1"):
        group_substitution_rdp(1.0, np.log([0.5, 0.5]), [1.0])


@pytest.mark.parametrize(("group", "q", "sigma"), [(1000, 0.001, 500.0), (200, 0.001, 100.0), (983, 0.1, 5.0)])
def test_large_groups_keep_the_terms_whose_probability_underflows(group, q, sigma):
    """The large-j terms dominate at high orders and underflow as probabilities (binom.pmf(1000, 1000, 0.001) = 0):
    the bound is computed in log space, against the formula written out with math.lgamma."""
    orders = [2.0, 32.0, 256.0, 4096.0]
    got = group_substitution_rdp(sigma, cohort_count_logpmf(group, sample_rate=q), orders)
    for a, g in zip(orders, got, strict=True):
        logs = [math.lgamma(group + 1) - math.lgamma(j + 1) - math.lgamma(group - j + 1) + j * math.log(q)
                + (group - j) * math.log1p(-q) + 2 * a * (a - 1) * j * j / sigma**2 for j in range(group + 1)]  # fmt: skip
        top = max(logs)
        want = (top + math.log(sum(math.exp(x - top) for x in logs))) / (a - 1)
        assert g == pytest.approx(want, rel=1e-9)
