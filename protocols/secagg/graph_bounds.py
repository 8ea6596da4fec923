"""How many SecAgg+ neighbours a cohort needs: ``secure_aggregation.neighbors: auto``.

Bell et al. (CCS 2020) replace SecAgg's complete graph by a sparse one of logarithmic degree and show that the
protocol keeps its guarantees when three events are unlikely. For the graph :func:`~protocols.secagg.protocol.
neighbour_graph` builds (a ring over a uniformly random order of the cohort, each client joined to the h = k/2
nearest on either side, so its k neighbours are a uniformly random k-subset of the others), this module bounds
their probabilities and picks the least even k that makes them small. The bounds are union bounds computed here for
that graph, under Bell et al.'s conditions; their paper's own tables are for another graph (Erdős–Rényi) and are not
used.

Model: n clients in the round; a set C of ⌊γ·n⌋ clients colludes with the honest-but-curious server, chosen before
the round's order is drawn (static corruption, as in Bell et al.); each client drops out of the round (at any
stage) with probability at most δ, independently; t = ⌈τ·(k + 1)⌉ (``secure_aggregation.threshold`` τ).

**Privacy fails** (the server and C learn more than the sum of the honest survivors' inputs) only if

* (P1) some honest client u has ≥ t colluders among its k neighbours: they hold t shares of both of u's secrets,
  and with the t shares of the other secret that the protocol hands the server, its input is in the clear. The
  number of colluders among u's neighbours is hypergeometric (k draws from the n − 1 others, ⌊γn⌋ of them in C):
  ``P1 ≤ n · P[Hyp(n − 1, ⌊γn⌋, k) ≥ t]``;
* (P2) the graph on the honest survivors splits: the masks between two parts would no longer cancel within each
  part, so the server learns each part's sum. On a ring joined h deep, the remaining clients split only if two
  disjoint runs of h consecutive clients are all removed (colluding or dropped); a given set of j positions is all
  removed with probability ≤ (γ + δ)^j, and there are fewer than n²/2 pairs of runs:
  ``P2 ≤ n(n − 1)/2 · (γ + δ)^k``.

**The round aborts** (safely: nothing is applied) only if

* (A1) some client's neighbourhood loses more than k − t clients, leaving fewer than t shares of a secret the server
  needs: ``A1 ≤ n · P[Bin(k, δ) ≥ k − t + 1]``;
* (A2) the survivors' graph splits (the server's own check): ``A2 ≤ n(n − 1)/2 · δ^k``.

``neighbors: auto`` takes the least even k with ``P1 + P2 ≤ 2^−security_bits`` and ``A1 + A2 ≤ 2^−correctness_bits``;
if no k below n − 1 meets both, the round uses the complete graph (plain SecAgg, where t = ⌈τ·n⌉). The colluders
the server may hold are the config's ``corrupt_fraction``; a colluding client beyond that bound, or one chosen after
the round's order is known (the order comes from the run's seed and the round), is outside the guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from protocols.secagg.protocol import threshold_for


@dataclass(frozen=True)
class GraphChoice:
    """The graph a round of n clients uses: ``neighbors`` None means complete; the bounds as log2 probabilities."""

    n: int
    neighbors: int | None
    threshold: int
    log2_privacy_failure: float
    log2_abort: float


def _log2(p: float) -> float:
    return math.log2(p) if p > 0 else -math.inf


def hypergeom_tail(population: int, marked: int, draws: int, at_least: int) -> float:
    """P[X ≥ at_least] for X the marked items among ``draws`` taken without replacement (exact integer sums)."""
    lo, hi = max(at_least, 0), min(marked, draws)
    if lo > hi:
        return 0.0
    num = sum(math.comb(marked, i) * math.comb(population - marked, draws - i) for i in range(lo, hi + 1))
    return num / math.comb(population, draws)


def binom_tail(trials: int, p: float, at_least: int) -> float:
    """P[Bin(trials, p) ≥ at_least]."""
    if at_least <= 0:
        return 1.0
    if at_least > trials or p <= 0.0:
        return 0.0
    return min(1.0, sum(math.comb(trials, i) * p**i * (1.0 - p) ** (trials - i) for i in range(at_least, trials + 1)))


def failure_bounds(n: int, k: int, *, threshold: float, corrupt_fraction: float, dropout: float) -> tuple[float, float]:
    """(privacy failure, abort) probability bounds for a round of ``n`` clients on the ring joined k/2 deep."""
    if k % 2 or k < 2 or k >= n - 1:
        raise ValueError(f"k must be even, ≥ 2 and below n − 1 = {n - 1}, got {k}")
    t = threshold_for(k + 1, threshold)
    corrupt = math.floor(corrupt_fraction * n)
    pairs = n * (n - 1) / 2
    privacy = n * hypergeom_tail(n - 1, corrupt, k, t) + pairs * (corrupt / n + dropout) ** k
    abort = n * binom_tail(k, dropout, k - t + 1) + pairs * dropout**k
    return min(1.0, privacy), min(1.0, abort)


@lru_cache(maxsize=256)
def auto_neighbours(
    n: int, *, threshold: float, corrupt_fraction: float, dropout: float, security_bits: float, correctness_bits: float
) -> GraphChoice:
    """The least even k whose bounds (module docstring) meet ``2^−security_bits`` and ``2^−correctness_bits``.

    Complete (``neighbors=None``) when no k below n − 1 does; the bounds are then 0 for P1/P2 unless ⌊γn⌋ ≥ t, since
    on the complete graph a client's secrets are shared among all n and the honest survivors stay connected.
    """
    for k in range(2, n - 1, 2):
        privacy, abort = failure_bounds(n, k, threshold=threshold, corrupt_fraction=corrupt_fraction, dropout=dropout)
        if privacy <= 2.0**-security_bits and abort <= 2.0**-correctness_bits:
            return GraphChoice(n, k, threshold_for(k + 1, threshold), _log2(privacy), _log2(abort))
    return complete_graph(n, threshold=threshold, corrupt_fraction=corrupt_fraction, dropout=dropout)


def complete_graph(n: int, *, threshold: float, corrupt_fraction: float, dropout: float) -> GraphChoice:
    """Plain SecAgg: every client shares with all n − 1 others, t = ⌈τ·n⌉; the survivors cannot split, and the
    colluders hold a client's secrets only if they are ≥ t; the round aborts if more than n − t drop."""
    t = threshold_for(n, threshold)
    privacy = 1.0 if math.floor(corrupt_fraction * n) >= t else 0.0
    abort = binom_tail(n, dropout, n - t + 1) if n > 1 else 0.0
    return GraphChoice(n, None, t, _log2(privacy), _log2(abort))


def round_dropout(cfg) -> float:
    """δ for the bounds: ``dropout_bound``, or the simulated chance to drop at any of the round's 4 stages if larger."""
    return max(cfg.dropout_bound, 1.0 - (1.0 - cfg.dropout) ** 4)


def graph_for(n: int, cfg) -> GraphChoice:
    """The graph of a round of ``n`` clients under a ``secure_aggregation`` config (its ``neighbors`` setting)."""
    delta = round_dropout(cfg)
    if cfg.neighbors == "auto":
        return auto_neighbours(
            n, threshold=cfg.threshold, corrupt_fraction=cfg.corrupt_fraction, dropout=delta,
            security_bits=cfg.security_bits, correctness_bits=cfg.correctness_bits,
        )  # fmt: skip
    k = cfg.neighbors
    if k is None or k >= n - 1:
        return complete_graph(n, threshold=cfg.threshold, corrupt_fraction=cfg.corrupt_fraction, dropout=delta)
    even = 2 * max(1, k // 2)  # the ring joins k // 2 on either side
    privacy, abort = failure_bounds(n, even, threshold=cfg.threshold, corrupt_fraction=cfg.corrupt_fraction, dropout=delta)
    return GraphChoice(n, k, threshold_for(even + 1, cfg.threshold), _log2(privacy), _log2(abort))
