"""SecAgg+ neighbour graphs: the round aborts when the survivors' graph splits, since the server could learn partial sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from protocols.crypto import KeyPair, prg_words, shamir_combine
from protocols.secagg import protocol
from protocols.secagg.encoding import FixedPoint
from protocols.secagg.protocol import SecAggAbort, SecAggClient, _pair_info, components, neighbour_graph, secure_sum
from secure_fed.config import build_plan

STAGES = ("advertise", "share", "input", "unmask")

# The audit's case: n = 20, k = 4, t = 3. neighbour_graph(range(20), 4, seed=0) is the ring ±1, ±2 over the public
# shuffle [4, 19, 6, 2, 13, 16, 3, 11, 10, 8, 0, 12, 7, 5, 18, 17, 14, 9, 1, 15]; dropping ring positions {0, 1} and
# {10, 11} = clients {4, 19} and {0, 12} leaves two arcs of 8 with no edge between them (edges span ≤ 2 positions).
N, K, T, SEED = 20, 4, 3, 0
SPLIT_DROP = {0, 4, 12, 19}
ARC_A = {6, 2, 13, 16, 3, 11, 10, 8}
ARC_B = {7, 5, 18, 17, 14, 9, 1, 15}


def scipy_parts(graph: dict[int, list[int]], alive: set[int]) -> list[set[int]]:
    """Connected components of the induced graph by scipy, independent of ``protocol.components``."""
    nodes = sorted(alive)
    idx = {u: i for i, u in enumerate(nodes)}
    rows, cols = [], []
    for u in nodes:
        for v in graph.get(u, ()):
            if v in idx and v != u:
                rows.append(idx[u])
                cols.append(idx[v])
    mat = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(mat, directed=False)
    parts: dict[int, set[int]] = {}
    for u in nodes:
        parts.setdefault(int(labels[idx[u]]), set()).add(u)
    return list(parts.values())


def as_partition(parts: list[set[int]]) -> set[frozenset[int]]:
    return {frozenset(p) for p in parts}


def encoded_inputs(seed: int, n: int = N, size: int = 11) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**64, size=size, dtype=np.uint64) for u in range(n)}


def plain_sum(enc: dict[int, np.ndarray], members: set[int]) -> np.ndarray:
    """Σ enc[u] mod 2^64 by exact Python integers, independent of uint64 wrap-around."""
    size = len(next(iter(enc.values())))
    return np.array([sum(int(enc[u][i]) for u in members) % 2**64 for i in range(size)], dtype=np.uint64)


# ---------------------------------------------------------------- components()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 14), p=st.floats(0.0, 0.5), seed=st.integers(0, 2**31), symmetric=st.booleans())
def test_components_matches_scipy_on_random_graphs(n, p, seed, symmetric):
    rng = np.random.default_rng(seed)
    graph: dict[int, list[int]] = {u: [] for u in range(n)}
    for u in range(n):
        for v in range(n):
            if u != v and rng.random() < p:
                graph[u].append(v)
                if symmetric:
                    graph[v].append(u)
    alive = {u for u in range(n) if rng.random() < 0.8} | ({n + 3} if n and rng.random() < 0.3 else set())  # + one unknown id
    parts = components(graph, alive)
    assert as_partition(parts) == as_partition(scipy_parts(graph, alive))
    assert sorted(u for c in parts for u in c) == sorted(alive)  # a partition of alive, nothing else
    assert [len(c) for c in parts] == sorted((len(c) for c in parts), reverse=True)


def test_components_of_ring_and_complete_graph():
    ring = neighbour_graph(list(range(N)), K, SEED)
    assert components(ring, set(range(N))) == [set(range(N))]
    assert components(ring, set()) == []
    assert as_partition(components(ring, set(range(N)) - SPLIT_DROP)) == {frozenset(ARC_A), frozenset(ARC_B)}
    complete = neighbour_graph(list(range(9)), None, 0)
    for alive in ({0}, {3, 7}, {1, 2, 5, 8}):
        assert components(complete, alive) == [alive]


# ---------------------------------------------------------------- the audit's split


def test_audit_scenario_really_splits():
    """Independent of the code under test: scipy on the induced graph, and no edge crosses the two arcs."""
    graph = neighbour_graph(list(range(N)), K, SEED)
    survivors = set(range(N)) - SPLIT_DROP
    assert as_partition(scipy_parts(graph, survivors)) == {frozenset(ARC_A), frozenset(ARC_B)}
    assert not any(v in ARC_B for u in ARC_A for v in graph[u])
    # and every survivor's neighbourhood keeps ≥ t live members, so only connectivity can stop the round
    assert all(len(({u} | set(graph[u])) & survivors) >= T for u in survivors)


def test_split_after_dropouts_aborts_before_any_unmasking_share(monkeypatch):
    asked = []
    real_unmask = SecAggClient.unmask

    def spy(self, survived, dropped):
        asked.append(self.cid)
        return real_unmask(self, survived, dropped)

    monkeypatch.setattr(SecAggClient, "unmask", spy)
    enc = encoded_inputs(1)
    with pytest.raises(SecAggAbort, match=r"at MaskedInput: .*16 surviving clients splits into 2 parts \(sizes 8, 8\)"):
        secure_sum(enc, threshold=T, neighbors=K, graph_seed=SEED, drop={"input": SPLIT_DROP})
    assert asked == []  # no client was asked for a share


@pytest.mark.parametrize("stage, name", [("advertise", "AdvertiseKeys"), ("share", "ShareKeys")])
def test_split_at_earlier_stages_aborts_there(stage, name):
    with pytest.raises(SecAggAbort, match=rf"at {name}: .*splits into 2 parts \(sizes 8, 8\).*partial sums"):
        secure_sum(encoded_inputs(2), threshold=T, neighbors=K, graph_seed=SEED, drop={stage: SPLIT_DROP})


def test_server_that_holds_back_request_unmasking_still_checks_before_using_shares():
    """A caller (like the layer) that hands replies straight to unmask(): the check runs before any share is recorded."""
    enc = encoded_inputs(3)
    graph = neighbour_graph(list(range(N)), K, SEED)
    clients = {u: SecAggClient(u, 0, graph[u], T) for u in range(N)}
    server = protocol.SecAggServer(round_idx=0, graph=graph, threshold=T, bits=64)
    pks = server.collect_keys({u: c.advertise() for u, c in clients.items()})
    inbox = server.route_shares({u: c.share_keys(pks) for u, c in clients.items()})
    for u, c in clients.items():
        c.receive_shares(inbox[u])
    for u in sorted(set(range(N)) - SPLIT_DROP):
        server.add_masked(u, clients[u].masked_input(enc[u], list(range(N)), 64))
    replies = {u: clients[u].unmask(server.u3, SPLIT_DROP) for u in server.u3}
    with pytest.raises(SecAggAbort, match="MaskedInput.*splits into 2 parts"):
        server.unmask(replies, 11)
    assert not any(kind == "unmask" for kind, _, _ in server.transcript)


def _partial_sum_from_server_view(server, members: set[int], size: int) -> np.ndarray:
    """What the server can compute from its transcript and public keys alone: Σ_{u ∈ members} y_u minus the self
    masks it rebuilds and the masks with dropped clients whose keys it rebuilds. Exact iff ``members`` is a union of
    components of the graph on U3 (the remaining pairwise masks then cancel)."""
    masked = {u: y for kind, u, y in server.transcript if kind == "masked_input"}
    b_sh: dict[int, list] = {}
    s_sh: dict[int, list] = {}
    for kind, _, per in server.transcript:
        if kind == "unmask":
            for u, (which, share) in per.items():
                (b_sh if which == "b" else s_sh).setdefault(u, []).append(share)
    u3 = set(masked)
    dropped = server.u2 - u3
    total = np.zeros(size, dtype=np.uint64)
    for u in members:
        y = masked[u] - prg_words(shamir_combine(b_sh[u][: server.t]), size, bits=64)
        for v in set(server.graph[u]) & dropped:
            s_v = KeyPair.from_private_bytes(shamir_combine(s_sh[v][: server.t]))
            m = prg_words(s_v.agree(server.public_keys[u]["s_pk"], info=_pair_info(u, v, server.round_idx) + b" mask"), size)
            y = y - m if u < v else y + m  # u added +m iff u < v
        total = total + y
    return total


def test_without_the_check_the_server_learns_each_component_sum(monkeypatch):
    """The leak is real: with the connectivity check disabled the round completes, and from its own view the server
    computes the exact sum of each arc's 8 inputs; a set that cuts an arc stays masked."""
    monkeypatch.setattr(protocol, "components", lambda graph, alive: [set(alive)] if alive else [])
    enc = encoded_inputs(4)
    # without the consistency check too, whose quorum would abort this round (4 of a group of 5 must sign)
    total, u3, server = secure_sum(enc, threshold=T, neighbors=K, graph_seed=SEED, drop={"input": SPLIT_DROP},
                                   consistency_check=False)  # fmt: skip
    assert u3 == ARC_A | ARC_B and np.array_equal(total, plain_sum(enc, u3))
    for arc in (ARC_A, ARC_B):
        assert np.array_equal(_partial_sum_from_server_view(server, arc, 11), plain_sum(enc, arc))
    half = set(sorted(ARC_A)[:4]) | ARC_B  # not a union of components: pairwise masks remain
    assert not np.array_equal(_partial_sum_from_server_view(server, half, 11), plain_sum(enc, half))


def test_dropouts_at_unmasking_only_do_not_split_u3():
    """The same four dropping after their masked input: U3 is all 20 (connected), so the sum is safe and exact."""
    enc = encoded_inputs(5)
    total, u3, _ = secure_sum(enc, threshold=T, neighbors=K, graph_seed=SEED, drop={"unmask": SPLIT_DROP})
    assert u3 == set(range(N)) and np.array_equal(total, plain_sum(enc, u3))


# ---------------------------------------------------------------- connected cases stay exact


def _expected_outcome(graph: dict[int, list[int]], t: int, drop: dict[str, set[int]]) -> str:
    """'ok', 'threshold', 'split' or 'quorum', from the protocol's rules, computed without the server (scipy for
    connectivity)."""
    alive, sets = set(graph), []
    for stage in STAGES:
        alive = alive - drop.get(stage, set())
        sets.append(set(alive))
    u1, u2, u3, u4 = sets

    def group(u):
        return {u} | set(graph[u])

    for s, linked in ((u1, u1), (u2, u2), (u3, u3), (u4, u3)):  # stage by stage, as the server checks
        if len(s) < t or any(len(group(u) & s) < t for u in s):
            return "threshold"
        if len(scipy_parts(graph, linked)) > 1:
            return "split"
        if s is u3:  # the consistency check: ⌈(|H_u| + t)/2⌉ of u's share holders H_u (u and its neighbours in U1) sign U3
            for u in u2:
                holders = group(u) & (u1 | {u})
                if 2 * len(holders & u3) < len(holders) + t:
                    return "quorum"
    if any(len(group(u) & u4) < t for u in u2):  # shares of a self mask or of a dropped client's key
        return "threshold"
    return "ok"


@pytest.mark.parametrize("seed", range(6))
def test_complete_graph_with_dropouts_is_exact(seed):
    rng = np.random.default_rng(100 + seed)
    n, t = 8, 5
    fp = FixedPoint(50.0, 16, 64)
    xs = {u: rng.normal(size=13) for u in range(n)}
    enc = {u: fp.encode(x) for u, x in xs.items()}
    order = [int(u) for u in rng.permutation(n)]
    drop = {"advertise": {order[0]}, "share": set(), "input": {order[1]}, "unmask": {order[2]} if seed % 2 else set()}
    assert _expected_outcome(neighbour_graph(list(range(n)), None, 0), t, drop) == "ok"
    total, u3, _ = secure_sum(enc, threshold=t, drop=drop)
    assert u3 == set(range(n)) - {order[0], order[1]}
    assert np.array_equal(total, plain_sum(enc, u3))
    assert np.allclose(fp.decode_sum(total), np.sum([xs[u] for u in sorted(u3)], axis=0), atol=len(u3) * 2.0**-16)


def test_sparse_graphs_with_random_dropouts_exact_iff_connected():
    outcomes = []
    for seed in range(16):
        rng = np.random.default_rng(seed)
        k = (4, 6)[seed % 2]
        graph = neighbour_graph(list(range(N)), k, seed)
        t = 3 if k == 4 else 4
        pool = [int(u) for u in rng.permutation(N)]
        drop, i = {}, 0
        for stage in STAGES:
            m = int(rng.integers(0, 2))
            drop[stage], i = set(pool[i : i + m]), i + m
        fp = FixedPoint(50.0, 16, 64)
        xs = {u: rng.normal(size=7) for u in range(N)}
        enc = {u: fp.encode(x) for u, x in xs.items()}
        expect = _expected_outcome(graph, t, drop)
        outcomes.append(expect)
        if expect == "ok":
            total, u3, _ = secure_sum(enc, threshold=t, neighbors=k, drop=drop, graph_seed=seed)
            assert u3 == set(range(N)) - drop["advertise"] - drop["share"] - drop["input"]
            assert np.array_equal(total, plain_sum(enc, u3))
            assert np.allclose(fp.decode_sum(total), np.sum([xs[u] for u in sorted(u3)], axis=0), atol=N * 2.0**-16)
        else:
            with pytest.raises(SecAggAbort, match={"split": "splits", "quorum": "quorum"}.get(expect, "threshold")):
                secure_sum(enc, threshold=t, neighbors=k, drop=drop, graph_seed=seed)
    # a few dropouts rarely split a ring with k ≥ 4; at k = 4 (groups of 5, quorum 4) two losses near one client abort
    assert outcomes.count("ok") >= 8 and "quorum" in outcomes, outcomes


@pytest.mark.parametrize("layer", ["secure_aggregation", "ckks"])
def test_a_cohort_of_one_client_is_aborted_not_summed(tmp_path, layer):
    """A secure (or encrypted) sum over one client is that client's update in the clear: the round is aborted."""
    from secure_fed.engine import Experiment
    from tests.conftest import small_config

    cfg = small_config(f"protocols=[{layer}]", "algorithm.name=fedaws", "training.rounds=2", "training.clients_per_round=1")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    res = exp.run(progress=False)
    assert res.summary["status"] == "failed" and res.summary["rounds_aborted"] == 2
    assert [("a cohort of one client" in d.get("aborted", "")) for d in exp.diagnostics] == [True, True]
