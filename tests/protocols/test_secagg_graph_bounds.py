"""``secure_aggregation.neighbors: auto``: the bounds of protocols.secagg.graph_bounds against independent computations
(scipy's distributions, every removal set of a small ring, sampled graphs), and the graph a round actually uses."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from scipy.stats import binom, hypergeom

from protocols.config_sections import SecureAggregationConfig
from protocols.secagg.graph_bounds import (
    auto_neighbours,
    binom_tail,
    complete_graph,
    failure_bounds,
    graph_for,
    hypergeom_tail,
)
from protocols.secagg.protocol import components, neighbour_graph
from tests.conftest import small_plan


def test_the_tails_match_scipy():
    for pop, marked, draws in [(29, 9, 6), (158, 7, 32), (999, 49, 34), (40, 0, 10), (12, 12, 5)]:
        for at_least in range(0, draws + 2):
            assert hypergeom_tail(pop, marked, draws, at_least) == pytest.approx(
                hypergeom.sf(at_least - 1, pop, marked, draws), rel=1e-9, abs=1e-300
            )
    for trials, p in [(32, 0.05), (10, 0.3), (7, 0.0), (5, 1.0)]:
        for at_least in range(0, trials + 2):
            assert binom_tail(trials, p, at_least) == pytest.approx(binom.sf(at_least - 1, trials, p), rel=1e-9, abs=1e-300)
    # thousands of trials (C(n, i) far beyond a float): log-space terms, no overflow
    for trials, p, at_least in [(5000, 0.05, 260), (5000, 0.05, 2001), (3000, 0.45, 1201)]:
        assert binom_tail(trials, p, at_least) == pytest.approx(binom.sf(at_least - 1, trials, p), rel=1e-7, abs=1e-300)
    assert hypergeom_tail(99_999, 5_000, 42, 26) == pytest.approx(hypergeom.sf(25, 99_999, 5_000, 42), rel=1e-7)


def test_large_cohorts_get_their_bounds_quickly():
    """The complete graph of 5,000 clients, and an auto search that no sparse graph satisfies (dropouts near 1 − τ),
    finish without overflow; the latter reports that the targets are not met."""
    full = complete_graph(5000, threshold=0.6, corrupt_fraction=0.05, dropout=0.05)
    assert full.neighbors is None and full.threshold == 3000
    one = complete_graph(1, threshold=0.6, corrupt_fraction=0.05, dropout=0.0)
    assert one.log2_abort == 0.0 and not auto_neighbours(1, threshold=0.6, corrupt_fraction=0.05, dropout=0.0,
                                                         security_bits=40, correctness_bits=20).meets_targets  # fmt: skip
    hopeless = graph_for(3000, SecureAggregationConfig(dropout_bound=0.45))
    assert hopeless.neighbors is None and not hopeless.meets_targets and hopeless.log2_abort > -1


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


def test_the_split_bound_holds_for_a_fixed_number_of_colluders_and_random_drops():
    """Exactly: every set of m = 3 colluders among 12 (uniform) and every set of drops among the rest (each with
    δ = 0.15) on the real ring at k = 4; the chance the honest survivors split stays below n(n − 1)/2 · (m/n + δ)^k."""
    n, k, m, delta = 12, 4, 3, 0.15
    cohort = list(range(n))
    graph = neighbour_graph(cohort, k, seed=5)
    sets = list(itertools.combinations(cohort, m))
    exact = 0.0
    for colluders in sets:
        rest = [u for u in cohort if u not in colluders]
        for size in range(len(rest) + 1):
            for dropped in itertools.combinations(rest, size):
                honest = set(rest) - set(dropped)
                if len(components(graph, honest)) >= 2:
                    exact += delta**size * (1 - delta) ** (len(rest) - size) / len(sets)
    bound = n * (n - 1) / 2 * (m / n + delta) ** k
    assert 0 < exact <= bound
    privacy, _ = failure_bounds(n, k, threshold=0.99, corrupt_fraction=m / n, dropout=delta)
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
    """159 clients, τ 0.6, 5% colluders, 5% dropouts, 2^-40 / 2^-20: against an honest-but-curious server k = 32
    (t = 20), a fifth of the complete graph's 158 neighbours; against a server that may deviate, with the consistency
    check (the default) its quorum's abort term asks k = 110, and without it the 2t − (k + 1) colluders that suffice
    ask k = 36; small cohorts keep the complete graph."""
    cfg = SecureAggregationConfig()
    assert cfg.neighbors == "auto" and cfg.consistency_check
    passive = auto_neighbours(159, threshold=0.6, corrupt_fraction=0.05, dropout=0.05, security_bits=40, correctness_bits=20)
    assert (passive.neighbors, passive.threshold) == (32, 20)
    got = graph_for(159, cfg)
    assert (got.neighbors, got.threshold) == (110, 67) and got.meets_targets
    unchecked = graph_for(159, SecureAggregationConfig(consistency_check=False))
    assert (unchecked.neighbors, unchecked.threshold) == (36, 23)
    # the unchecked bound at k = 32 counts 2·20 − 33 = 7 colluders, and misses the target the passive one meets
    priv7, _ = failure_bounds(159, 32, threshold=0.6, corrupt_fraction=0.05, dropout=0.05, server="unchecked")
    assert math.log2(priv7) > -40 > passive.log2_privacy_failure
    assert graph_for(20, cfg).neighbors is None and graph_for(20, cfg).threshold == 12


def test_a_fixed_or_complete_graph_reports_its_own_bounds():
    cfg = SecureAggregationConfig(neighbors=16)
    got = graph_for(159, cfg)
    priv, abort = failure_bounds(159, 16, threshold=0.6, corrupt_fraction=0.05, dropout=0.05, server="checked")
    assert got.neighbors == 16 and got.log2_privacy_failure == pytest.approx(math.log2(priv))
    assert got.log2_abort == pytest.approx(math.log2(abort))
    full = graph_for(159, SecureAggregationConfig(neighbors=None))
    assert full.neighbors is None and full.threshold == 96 and full.log2_privacy_failure == -math.inf
    assert full == complete_graph(159, threshold=0.6, corrupt_fraction=0.05, dropout=0.05, server="checked")
    # colluders reaching t on the complete graph: no guarantee
    assert complete_graph(10, threshold=0.6, corrupt_fraction=0.49, dropout=0.0).log2_privacy_failure == -math.inf
    assert complete_graph(10, threshold=0.3, corrupt_fraction=0.4, dropout=0.0).log2_privacy_failure == 0.0


def test_the_simulated_dropout_raises_the_bound_it_is_sized_for():
    """δ is the larger of dropout_bound and the chance to drop at any of the 4 simulated stages."""
    low = graph_for(400, SecureAggregationConfig(dropout_bound=0.0, consistency_check=False))
    high = graph_for(400, SecureAggregationConfig(dropout_bound=0.0, dropout=0.05, consistency_check=False))
    same = auto_neighbours(400, threshold=0.6, corrupt_fraction=0.05, dropout=1 - 0.95**4, security_bits=40,
                           correctness_bits=20, server="unchecked")  # fmt: skip
    assert high == same and high.neighbors > low.neighbors
    # with the consistency check a drop costs twice (it may leave both the holders and the signers): δ ≈ 0.19 at
    # the 4 stages leaves no sparse graph that meets 2^-20, and the complete graph's own bound is reported
    checked = graph_for(400, SecureAggregationConfig(dropout_bound=0.0, dropout=0.05))
    assert checked.neighbors is None and not checked.meets_targets


@pytest.mark.parametrize("bad", [1, 0, -4])
def test_fewer_than_two_neighbours_is_refused(bad):
    with pytest.raises(ValueError, match="at least 2"):
        SecureAggregationConfig(neighbors=bad)


def test_a_round_uses_the_auto_graph_and_reports_its_bounds(tmp_path):
    """A 40-client round under the default: every client gets k = 30 neighbours (complete would be 39), and the round's
    private diagnostics carry k, t and the bounds; with neighbors: null the same round is complete. (Without the
    consistency check: with it, 40 clients get the complete graph.)"""
    from secure_fed.engine import Experiment

    base = ["protocols=[secure_aggregation]", "algorithm.name=fedaws", "training.rounds=1",
            "dataset.synthetic.num_labels=40", "training.clients_per_round=40",
            "secure_aggregation.consistency_check=false"]  # fmt: skip
    unchecked = SecureAggregationConfig(consistency_check=False)
    assert graph_for(40, SecureAggregationConfig()).neighbors is None
    want = graph_for(40, unchecked)
    assert want.neighbors == 30
    for extra, k, t in [([], 30, 19), (["secure_aggregation.neighbors=null"], 39, 24)]:
        run_dir = tmp_path / f"run{k}"
        Experiment(small_plan(*base, *extra), run_dir=run_dir).run(progress=False)
        stats = [json.loads(line) for line in (run_dir / "private" / "diagnostics.jsonl").read_text().splitlines()][-1]
        assert stats["secagg_neighbours"] == k and stats["secagg_threshold"] == t
        if k == 30:
            assert stats["secagg_log2_privacy_bound"] == pytest.approx(want.log2_privacy_failure, abs=0.01)
            assert stats["secagg_log2_abort_bound"] == pytest.approx(want.log2_abort, abs=0.01)
        else:
            assert stats["secagg_log2_privacy_bound"] is None
    # a cohort of 40 from 45 clients: the colluders are counted in the federation (⌊0.05·45⌋ = 2 of 45), not the cohort
    run_dir = tmp_path / "sampled"
    sampled = [*base[:3], "dataset.synthetic.num_labels=45", "training.clients_per_round=40", base[-1]]
    Experiment(small_plan(*sampled), run_dir=run_dir).run(progress=False)
    stats = json.loads((run_dir / "private" / "diagnostics.jsonl").read_text().splitlines()[-1])
    want = graph_for(40, unchecked, population=45)
    assert want.log2_privacy_failure != pytest.approx(graph_for(40, unchecked).log2_privacy_failure, abs=0.01)
    assert stats["secagg_log2_privacy_bound"] == pytest.approx(want.log2_privacy_failure, abs=0.01)


def test_validate_prints_the_graph_and_its_bounds(tmp_path):
    """``secure-fed validate`` names the graph a cohort of the configured size gets, t and both bounds."""
    from tests.config.test_bad_input import assert_one_error_line, cli
    from tests.conftest import SMALL

    cfg = tmp_path / "c.yaml"
    cfg.write_text("protocols: [secure_aggregation]\n")
    sets = [a for s in [*SMALL, "dataset.synthetic.num_labels=40", "secure_aggregation.consistency_check=false"]
            for a in ("--set", s)]  # fmt: skip
    want = graph_for(40, SecureAggregationConfig(consistency_check=False))
    code, out, err = cli("validate", str(cfg), *sets)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("secure_aggregation:"))
    assert "40 clients a round" in line and f"{want.neighbors} neighbours (neighbors: auto), t = {want.threshold}" in line
    assert f"privacy failure ≤ 2^{want.log2_privacy_failure:.1f}, abort ≤ 2^{want.log2_abort:.1f}" in line
    code, out, err = cli("validate", str(cfg), *sets, "--set", "secure_aggregation.neighbors=null")
    assert "complete graph (neighbors: null), t = 24" in out and "privacy failure ≤ 0" in out
    noisy = ["--set", "protocols=[dp, secure_aggregation]", "--set",
             "privacy.client={noise_multiplier: 1.0, clip_norm: 1.0, noise: clients}"]  # fmt: skip
    code, out, err = cli("validate", str(cfg), *sets, *noisy)
    assert code == 0, err
    assert f"sizes each share for t = {want.threshold}, so a sum of all 40 holds {40 / want.threshold:.1f}×" in out
    code, out, err = cli("validate", str(cfg), *sets, "--set", "secure_aggregation.neighbors=one")
    assert_one_error_line(code, err, "secure_aggregation.neighbors", "auto, or null")


def test_in_a_sampled_cohort_the_colluding_neighbours_follow_the_federations_hypergeometric_law():
    """A federation of 60 with 24 colluders; cohorts of 30 drawn uniformly with client 59 (honest) in them, each with
    its own graph: client 59 has ≥ t colluding neighbours as often as Hyp(N − 1, 24, k) says, the law the bound uses
    with ``population`` (not the cohort's own count, which varies)."""
    N, n, k, tau = 60, 30, 6, 0.6
    t = math.ceil(tau * (k + 1))
    colluders = set(range(24))
    rng = np.random.default_rng(0)
    draws, hits = 3000, 0
    for seed in range(draws):
        cohort = [59, *(int(u) for u in rng.choice(59, size=n - 1, replace=False))]
        graph = neighbour_graph(cohort, k, seed=seed)
        hits += len(colluders.intersection(graph[59])) >= t
    tail = hypergeom.sf(t - 1, N - 1, len(colluders), k)
    assert tail > 0.005
    assert abs(hits / draws - tail) < 4 * math.sqrt(tail * (1 - tail) / draws)
    # the bound with the federation's count: Bibtex-sized cohorts of 159 from 1,000 clients, 50 of them colluding
    privacy, _ = failure_bounds(159, 32, threshold=0.6, corrupt_fraction=0.05, dropout=0.05, population=1000)
    want = 159 * hypergeom.sf(19, 999, 50, 32) + 159 * 158 / 2 * (50 / 1000 + 0.05) ** 32
    assert privacy == pytest.approx(want, rel=1e-6, abs=0)


def test_a1_is_the_protocols_abort_rule():
    """On the real protocol (n = 40, k = 6, t = 5): a client that drops after sharing its keys needs t of its k
    neighbours at unmasking; losing k − t of them still completes the sum, losing k − t + 1 aborts it, as the A1
    term counts (Bin(k, δ) ≥ k − t + 1)."""
    from protocols.secagg.protocol import SecAggAbort, secure_sum

    n, k, tau, seed = 40, 6, 0.6, 11
    t = math.ceil(tau * (k + 1))
    graph = neighbour_graph(list(range(n)), k, seed=seed)
    rng = np.random.default_rng(0)
    enc = {u: rng.integers(0, 2**64, size=5, dtype=np.uint64) for u in range(n)}
    u = 7
    for lost, aborts in [(k - t, False), (k - t + 1, True)]:
        drop = {"input": {u}, "unmask": set(graph[u][:lost])}
        if aborts:
            with pytest.raises(SecAggAbort):
                secure_sum(enc, threshold=tau, neighbors=k, drop=drop, graph_seed=seed)
        else:
            total, u3, _ = secure_sum(enc, threshold=tau, neighbors=k, drop=drop, graph_seed=seed)
            assert u not in u3 and set(graph[u][:lost]) <= u3
            want = np.array([sum(int(enc[v][i]) for v in u3) % 2**64 for i in range(5)], dtype=np.uint64)
            assert np.array_equal(total, want)


@pytest.mark.parametrize("k,n,built", [(17, 159, 16), (16, 159, 16), (17, 18, None), (16, 18, 16), (3, 10, 2)])
def test_a_fixed_k_reports_the_degree_the_ring_builds(k, n, built):
    """The ring joins k // 2 on either side, so an odd k builds degree k − 1, and k ≥ n − 1 the complete graph."""
    got = graph_for(n, SecureAggregationConfig(neighbors=k))
    graph = neighbour_graph(list(range(n)), k, seed=0)
    degrees = {len(v) for v in graph.values()}
    assert degrees == {n - 1 if built is None else built}
    assert got.neighbors == built
    assert got.threshold == math.ceil(0.6 * ((n - 1 if built is None else built) + 1))


def test_each_round_draws_its_graph_from_the_servers_secret(tmp_path):
    """graph_seed null: two runs with the same config draw different graphs (the order comes from a fresh secret of
    the server's, in its private checkpoint); a resumed run draws the interrupted run's graphs; graph_seed set: the
    same graphs in every run."""
    from secure_fed.engine import Experiment

    def layer_of(exp):
        return next(la for la in exp.stack.layers if hasattr(la, "graph_stream"))

    base = [
        "protocols=[secure_aggregation]",
        "algorithm.name=fedaws",
        "training.rounds=2",
        "dataset.synthetic.num_labels=40",
        "secure_aggregation.consistency_check=false",
    ]  # a sparse graph at 40 clients
    a = Experiment(small_plan(*base, "output.log_messages=true"), run_dir=tmp_path / "a")
    b = Experiment(small_plan(*base), run_dir=tmp_path / "b")
    assert layer_of(a).graph_seed(1) != layer_of(b).graph_seed(1)
    a.run(progress=False)
    # the neighbours the server sent each client at round r's first stage: the ring over that secret order
    sent = {(m["message"]["secagg_round"], m["client"]): m["message"]["secagg_neighbours"] for m in a.messages
            if m["direction"] == "down" and m["message"].get("secagg") == "advertise"}  # fmt: skip
    for r in (0, 1):
        ring = neighbour_graph(list(range(40)), 30, seed=layer_of(a).graph_seed(r))
        assert {c: sent[(r, c)] for c in range(40)} == ring
    resumed = Experiment(small_plan(*base), run_dir=tmp_path / "a")
    assert resumed.resume()
    assert [layer_of(resumed).graph_seed(r) for r in (1, 2, 3)] == [layer_of(a).graph_seed(r) for r in (1, 2, 3)]
    fixed = [Experiment(small_plan(*base, "secure_aggregation.graph_seed=4"), run_dir=tmp_path / f"f{i}") for i in (0, 1)]
    assert layer_of(fixed[0]).graph_seed(1) == layer_of(fixed[1]).graph_seed(1)
