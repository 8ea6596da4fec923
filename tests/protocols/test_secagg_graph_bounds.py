"""``secure_aggregation.neighbors: auto``: the bounds of protocols.secagg.graph_bounds against independent computations
(scipy's distributions, every removal set of a small ring, sampled graphs), and the graph a round actually uses."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy.stats import binom, hypergeom

from protocols.config import SecureAggregationConfig
from protocols.secagg.graph_bounds import (
    auto_neighbours,
    binom_tail,
    complete_graph,
    failure_bounds,
    graph_for,
    hypergeom_tail,
)
from protocols.secagg.protocol import components, neighbour_graph


def test_the_tails_match_scipy():
    for pop, marked, draws in [(29, 9, 6), (158, 7, 32), (999, 49, 34), (40, 0, 10), (12, 12, 5)]:
        for at_least in range(0, draws + 2):
            assert hypergeom_tail(pop, marked, draws, at_least) == pytest.approx(
                hypergeom.sf(at_least - 1, pop, marked, draws), rel=1e-9, abs=1e-300
            )
    for trials, p in [(32, 0.05), (10, 0.3), (7, 0.0), (5, 1.0)]:
        for at_least in range(0, trials + 2):
            assert binom_tail(trials, p, at_least) == pytest.approx(binom.sf(at_least - 1, trials, p), rel=1e-9, abs=1e-300)


def _runs_of_removed(removed: set[int], order: list[int], h: int) -> int:
    """Maximal cyclic runs of ≥ h consecutive removed positions in ``order`` (all removed: one run)."""
    flags = [u in removed for u in order]
    n = len(flags)
    if all(flags):
        return 1
    start = flags.index(False)  # rotate so the circle starts at a kept position
    runs, length = 0, 0
    for i in range(1, n + 1):
        if flags[(start + i) % n]:
            length += 1
        else:
            runs += length >= h
            length = 0
    return runs


def test_a_ring_splits_exactly_when_two_runs_of_k_over_2_are_removed_and_the_split_bound_covers_it():
    """Every removal set of the real 12-client graph at k = 4: the survivors split iff two disjoint runs of h = 2
    positions are removed (the argument behind P2 and A2), and the exact split probability under independent removal
    with p = 0.3 stays below the bound n(n − 1)/2 · p^k."""
    n, k, p = 12, 4, 0.3
    cohort = list(range(n))
    graph = neighbour_graph(cohort, k, seed=3)
    order = [int(u) for u in np.random.default_rng(3).permutation(cohort)]  # neighbour_graph's public shuffle
    assert all(len(graph[u]) == k for u in cohort)
    exact = 0.0
    for size in range(n + 1):
        for removed in itertools.combinations(cohort, size):
            kept = set(cohort) - set(removed)
            split = len(components(graph, kept)) >= 2
            assert split == (_runs_of_removed(set(removed), order, k // 2) >= 2 and len(kept) >= 2), removed
            exact += split * p**size * (1 - p) ** (n - size)
    bound = n * (n - 1) / 2 * p**k
    assert 0 < exact <= bound
    # the P2 term of failure_bounds with no colluders is that bound
    privacy, _ = failure_bounds(n, k, threshold=0.99, corrupt_fraction=0.0, dropout=p)
    assert privacy == pytest.approx(min(1.0, bound))


def test_a_clients_neighbours_are_a_uniform_subset_so_the_collusion_term_is_hypergeometric():
    """Over 3,000 round orders of the real graph (n = 30, k = 6, 9 fixed colluders, t = 5), an honest client has ≥ t
    colluding neighbours as often as the hypergeometric tail says, and some honest client does at most as often as
    the union bound n·tail."""
    n, k, tau = 30, 6, 0.6
    t = math.ceil(tau * (k + 1))
    colluders = set(range(9))
    draws = 3000
    first, anyone = 0, 0
    for seed in range(draws):
        graph = neighbour_graph(list(range(n)), k, seed=seed)
        hits = {u: len(colluders.intersection(graph[u])) >= t for u in range(n) if u not in colluders}
        first += hits[9]
        anyone += any(hits.values())
    tail = hypergeom.sf(t - 1, n - 1, len(colluders), k)
    assert tail > 0.003
    sd = math.sqrt(tail * (1 - tail) / draws)
    assert abs(first / draws - tail) < 4 * sd
    assert anyone / draws <= min(1.0, n * tail)
    privacy, _ = failure_bounds(n, k, threshold=tau, corrupt_fraction=0.3, dropout=0.0)
    assert privacy == pytest.approx(min(1.0, n * tail + n * (n - 1) / 2 * 0.3**k))


def _least_k_by_scipy(n, tau, gamma, delta, sigma, eta):
    """The rule of the module docstring, written again from scipy's distributions."""
    c = math.floor(gamma * n)
    for k in range(2, n - 1, 2):
        t = max(1, math.ceil(tau * (k + 1)))
        pairs = n * (n - 1) / 2
        p_priv = n * hypergeom.sf(t - 1, n - 1, c, k) + pairs * (c / n + delta) ** k
        p_abort = n * binom.sf(k - t, k, delta) + pairs * delta**k
        if p_priv <= 2.0**-sigma and p_abort <= 2.0**-eta:
            return k
    return None


CASES = [  # (n, τ, γ, δ, σ, η) — each of the four terms binds in some case
    (159, 0.6, 0.05, 0.05, 40, 20),  # A1 (dropouts against t = 0.6·(k + 1)) binds: k = 32
    (159, 0.9, 0.1, 0.0, 40, 20),  # P2 binds (colluders splitting the ring)
    (159, 0.6, 0.3, 0.0, 40, 20),  # P1 binds (colluding neighbours)
    (400, 0.51, 0.0, 0.2, 40, 60),  # A1 binds, far above the rest
    (159, 0.05, 0.0, 0.3, 10, 20),  # A2 binds (drops splitting the ring); τ below the config's 0.5, so t is 1–2
    (1000, 0.6, 0.05, 0.05, 40, 20),
    (10000, 0.6, 0.01, 0.01, 40, 30),
    (50, 0.6, 0.05, 0.05, 40, 20),
    (30, 0.6, 0.05, 0.05, 40, 20),  # nothing below 29 qualifies: complete
]


@pytest.mark.parametrize("n,tau,gamma,delta,sigma,eta", CASES)
def test_auto_takes_the_least_even_k_that_meets_both_bounds(n, tau, gamma, delta, sigma, eta):
    got = auto_neighbours(n, threshold=tau, corrupt_fraction=gamma, dropout=delta, security_bits=sigma, correctness_bits=eta)
    assert got.neighbors == _least_k_by_scipy(n, tau, gamma, delta, sigma, eta)
    if got.neighbors is not None:
        assert got.log2_privacy_failure <= -sigma and got.log2_abort <= -eta
        assert got.threshold == math.ceil(tau * (got.neighbors + 1))


def test_each_term_binds_in_some_case():
    """The cases above are not all decided by one term: dropping any one term lowers k in at least one case."""

    def least(n, tau, gamma, delta, sigma, eta, skip):
        c = math.floor(gamma * n)
        for k in range(2, n - 1, 2):
            t = math.ceil(tau * (k + 1))
            pairs = n * (n - 1) / 2
            terms = {"P1": n * hypergeom.sf(t - 1, n - 1, c, k), "P2": pairs * (c / n + delta) ** k,
                     "A1": n * binom.sf(k - t, k, delta), "A2": pairs * delta**k}  # fmt: skip
            terms[skip] = 0.0
            if terms["P1"] + terms["P2"] <= 2.0**-sigma and terms["A1"] + terms["A2"] <= 2.0**-eta:
                return k
        return None

    for term in ("P1", "P2", "A1", "A2"):
        assert any(least(*case, skip=term) != _least_k_by_scipy(*case) for case in CASES), term


def test_the_defaults_at_bibtex_scale():
    """159 clients, τ 0.6, 5% colluders, 5% dropouts, 2^-40 / 2^-20: k = 32 (t = 20), a fifth of the complete graph's
    158 neighbours; small cohorts keep the complete graph."""
    cfg = SecureAggregationConfig()
    assert cfg.neighbors == "auto"
    got = graph_for(159, cfg)
    assert (got.neighbors, got.threshold) == (32, 20)
    assert graph_for(20, cfg).neighbors is None and graph_for(20, cfg).threshold == 12


def test_a_fixed_or_complete_graph_reports_its_own_bounds():
    cfg = SecureAggregationConfig(neighbors=16)
    got = graph_for(159, cfg)
    priv, abort = failure_bounds(159, 16, threshold=0.6, corrupt_fraction=0.05, dropout=0.05)
    assert got.neighbors == 16 and got.log2_privacy_failure == pytest.approx(math.log2(priv))
    assert got.log2_abort == pytest.approx(math.log2(abort))
    full = graph_for(159, SecureAggregationConfig(neighbors=None))
    assert full.neighbors is None and full.threshold == 96 and full.log2_privacy_failure == -math.inf
    assert full == complete_graph(159, threshold=0.6, corrupt_fraction=0.05, dropout=0.05)
    # colluders reaching t on the complete graph: no guarantee
    assert complete_graph(10, threshold=0.6, corrupt_fraction=0.49, dropout=0.0).log2_privacy_failure == -math.inf
    assert complete_graph(10, threshold=0.3, corrupt_fraction=0.4, dropout=0.0).log2_privacy_failure == 0.0


def test_the_simulated_dropout_raises_the_bound_it_is_sized_for():
    """δ is the larger of dropout_bound and the chance to drop at any of the 4 simulated stages."""
    low = graph_for(400, SecureAggregationConfig(dropout_bound=0.0))
    high = graph_for(400, SecureAggregationConfig(dropout_bound=0.0, dropout=0.05))
    same = auto_neighbours(400, threshold=0.6, corrupt_fraction=0.05, dropout=1 - 0.95**4, security_bits=40,
                           correctness_bits=20)  # fmt: skip
    assert high == same and high.neighbors > low.neighbors


@pytest.mark.parametrize("bad", [1, 0, -4])
def test_fewer_than_two_neighbours_is_refused(bad):
    with pytest.raises(ValueError, match="at least 2"):
        SecureAggregationConfig(neighbors=bad)


def test_a_round_uses_the_auto_graph_and_reports_its_bounds(tmp_path):
    """A 40-client round under the default: every client gets k = 30 neighbours (complete would be 39), and the round's
    private diagnostics carry k, t and the bounds; with neighbors: null the same round is complete."""
    from secure_fed.engine import Experiment
    from tests.conftest import small_config

    base = ["protocols=[secure_aggregation]", "algorithm.name=fedaws", "training.rounds=1",
            "dataset.synthetic.num_labels=40", "training.clients_per_round=40"]  # fmt: skip
    want = graph_for(40, SecureAggregationConfig())
    assert want.neighbors == 30
    for extra, k, t in [([], 30, 19), (["secure_aggregation.neighbors=null"], 39, 24)]:
        run_dir = tmp_path / f"run{k}"
        Experiment(small_config(*base, *extra), run_dir=run_dir).run(progress=False)
        stats = [json.loads(line) for line in (run_dir / "private" / "diagnostics.jsonl").read_text().splitlines()][-1]
        assert stats["secagg_neighbours"] == k and stats["secagg_threshold"] == t
        if k == 30:
            assert stats["secagg_log2_privacy_bound"] == pytest.approx(want.log2_privacy_failure, abs=0.01)
            assert stats["secagg_log2_abort_bound"] == pytest.approx(want.log2_abort, abs=0.01)
        else:
            assert stats["secagg_log2_privacy_bound"] is None


def test_validate_prints_the_graph_and_its_bounds(tmp_path):
    """``secure-fed validate`` names the graph a cohort of the configured size gets, t and both bounds."""
    from tests.config.test_bad_input import assert_one_error_line, cli
    from tests.conftest import SMALL

    cfg = tmp_path / "c.yaml"
    cfg.write_text("protocols: [secure_aggregation]\n")
    sets = [a for s in [*SMALL, "dataset.synthetic.num_labels=40"] for a in ("--set", s)]
    want = graph_for(40, SecureAggregationConfig())
    code, out, err = cli("validate", str(cfg), *sets)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("secure_aggregation:"))
    assert "40 clients a round" in line and f"{want.neighbors} neighbours (neighbors: auto), t = {want.threshold}" in line
    assert f"privacy failure ≤ 2^{want.log2_privacy_failure:.1f}, abort ≤ 2^{want.log2_abort:.1f}" in line
    code, out, err = cli("validate", str(cfg), *sets, "--set", "secure_aggregation.neighbors=null")
    assert "complete graph (neighbors: null), t = 24" in out and "privacy failure ≤ 0" in out
    code, out, err = cli("validate", str(cfg), *sets, "--set", "secure_aggregation.neighbors=one")
    assert_one_error_line(code, err, "secure_aggregation.neighbors", "auto, or null")
