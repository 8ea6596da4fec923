"""The RDP of a client-level Gaussian mechanism for one *instance* that sits on a group of clients.

Removing one training instance changes the data of every client that holds it: up to g clients (the public bound
``max_labels_per_instance`` in the positive-only setting; 1 in a partition that puts each instance on one client).
Each such client's clipped update u (‖u‖ ≤ C) becomes some u' (‖u'‖ ≤ C): a *substitution*, ‖u − u'‖ ≤ 2C. The
client-level mechanism releases Σ_{sampled} u_i + N(0, σ²C²·I), with the cohort drawn from a secret the same way under
both data sets (the coins do not depend on the data).

**The bound.** Condition on the sampled set S. Both outputs are then Gaussians, N(a_S, σ²C²I) and N(b_S, σ²C²I),
with ‖a_S − b_S‖ ≤ 2C·j, j = |S ∩ group|, so D_α(P_S‖Q_S) ≤ α(2j)²/(2σ²) (either direction). For α > 1 the map
(p, q) ↦ ∫ p^α q^{1−α} is jointly convex (the perspective of t ↦ t^α), so for the mixtures P = Σ_S w_S P_S and
Q = Σ_S w_S Q_S over the same cohort law w::

    exp((α − 1)·D_α(P‖Q)) ≤ Σ_S w_S exp((α − 1)·D_α(P_S‖Q_S)) ≤ E_j[ exp(α(α − 1)·(2j)²/(2σ²)) ]

    ε_g(α) = log E_j[ exp(2α(α − 1)·j²/σ²) ] / (α − 1)                                  (the group bound)

with j ~ Binomial(g, q) under Poisson sampling, Hypergeometric(N, g, m) for a fixed cohort of m of N clients, and j = g
when every client is in every round. It composes over rounds by addition, as any RDP curve, and holds whatever the
clients compute (only the clip is used), so it covers every round's adaptively chosen updates. It keeps part of the
amplification by sampling (a round without any of the group's clients costs nothing), not all of it: it is a valid
upper bound, never the realised loss. At g = 1, q = 1 it is the Gaussian mechanism at sensitivity 2C.

Adaptive clipping (Andrew et al. 2021) releases the clip bits' noisy count with the update: a substituted client
moves its centred bit by 1 (twice the add/remove sensitivity 1/2) and its update by 2C, so the pair is again one
Gaussian of multiplier σ at twice the sensitivity, and the same bound applies. DP-FTRL's tree is one Gaussian of
multiplier σ/√K with every client in every round: ε_g(α) = K·α(2g)²/(2σ²).
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp
from scipy.stats import binom, hypergeom


def cohort_count_logpmf(group: int, *, sample_rate: float, population: int | None = None,
                        cohort: int | None = None) -> np.ndarray:  # fmt: skip
    """log P(j of the group's ``group`` clients are in a round's cohort), j = 0..group (−inf outside the support).

    Poisson sampling (``cohort`` None): Binomial(group, q). A fixed cohort of ``cohort`` clients drawn without
    replacement from ``population``: Hypergeometric. q = 1: every client, j = group. In log space: the large-j terms
    dominate the bound at high orders and underflow as probabilities (binom.pmf(1000, 1000, 0.001) = 0.0)."""
    if group < 1:
        raise ValueError(f"group size {group} must be ≥ 1")
    j = np.arange(group + 1)
    if sample_rate >= 1.0 or (cohort is not None and population is not None and cohort >= population):
        return np.where(j == group, 0.0, -np.inf)
    if cohort is not None:
        if population is None:
            raise ValueError("a fixed cohort needs the population size")
        return hypergeom.logpmf(j, population, group, cohort)
    return binom.logpmf(j, group, sample_rate)


def cohort_count_pmf(group: int, **kw) -> np.ndarray:
    """:func:`cohort_count_logpmf` as probabilities (for display and tests)."""
    return np.exp(cohort_count_logpmf(group, **kw))


def group_substitution_rdp(sigma: float, logpmf: np.ndarray, orders) -> np.ndarray:
    """ε_g(α) of one round (the module's group bound) at each order α > 1: ``logpmf[j]`` = log P(j of the group
    sampled), noise multiplier ``sigma`` (noise std σC for clip norm C; each sampled member moves the sum by ≤ 2C)."""
    if not sigma > 0.0:
        raise ValueError(f"noise multiplier {sigma} must be positive")
    logpmf = np.asarray(logpmf, dtype=float)
    j = np.arange(len(logpmf), dtype=float)
    keep = np.isfinite(logpmf)  # only the support's complement (log 0) is dropped
    logw, jj = logpmf[keep], j[keep]
    out = []
    for a in np.asarray(orders, dtype=float):
        if not a > 1.0:
            raise ValueError(f"Rényi order {a} must exceed 1")
        out.append(float(logsumexp(logw + 2.0 * a * (a - 1.0) * jj**2 / sigma**2)) / (a - 1.0))
    return np.asarray(out)


def gaussian_rdp(sensitivity_over_sigma: float, orders) -> np.ndarray:
    """The Gaussian mechanism's RDP α·μ²/2 at μ = Δ/(σC) (no sampling)."""
    mu2 = float(sensitivity_over_sigma) ** 2
    return np.asarray([a * mu2 / 2.0 for a in np.asarray(orders, dtype=float)])


def substitution_sensitivity(group: int) -> float:
    """The shift of a sum of clipped vectors when ``group`` members are each substituted: 2·group (in units of C)."""
    return 2.0 * group


__all__ = ["cohort_count_logpmf", "cohort_count_pmf", "gaussian_rdp", "group_substitution_rdp", "substitution_sensitivity"]
