import itertools

import pytest
import torch
from torch.nn import functional as F

from secure_fed.algorithms.fedaws import regularizer_step
from secure_fed.algorithms.regularizers import (
    cooccurrence_counts,
    correlation_gamma,
    correlation_sigma,
    correlation_top_k,
    fixed_embedding_reg,
    nearest_classes,
    spreadout,
    spreadout_top_k,
)
from secure_fed.config import build_plan

# 4 instances, 3 labels:  {0,1}, {0}, {1,2}, {0,1}
Y = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 0]], dtype=torch.float32)


def d(u, v):
    return 1 - float(F.normalize(u, dim=0) @ F.normalize(v, dim=0))


def test_sigma_eq9_by_hand():
    s = correlation_sigma(Y)
    # σ_01 = #(0 positive and 1 negative)/4 = 1/4 (instance {0}); σ_10 = 1/4 ({1,2}); σ_02 = 3/4; σ_21 = 0
    assert s[0, 1] == pytest.approx(0.25) and s[1, 0] == pytest.approx(0.25)
    assert s[0, 2] == pytest.approx(0.75) and s[2, 1] == pytest.approx(0.0) and s[2, 0] == pytest.approx(0.25)
    assert torch.all(s.diagonal() == 0)


def test_gamma_eq10_rows_sum_to_one():
    g = correlation_gamma(correlation_sigma(Y))
    assert torch.allclose(g.sum(1), torch.ones(3, dtype=g.dtype))
    assert g[0, 2] == pytest.approx(0.75 / 1.0)


def test_spreadout_top_k_eq8_brute_force():
    torch.manual_seed(0)
    W = torch.randn(6, 4)
    k = 2
    nn = nearest_classes(W, k)
    brute = 0.0
    for c in range(6):
        dists = sorted((d(W[c], W[j]), j) for j in range(6) if j != c)
        assert set(nn[c].tolist()) == {j for _, j in dists[:k]}
        brute += sum(-(dist**2) for dist, _ in dists[:k])
    assert float(spreadout_top_k(W, k)) == pytest.approx(brute, rel=1e-5)


def test_spreadout_eq7_brute_force():
    torch.manual_seed(1)
    W = torch.randn(5, 3)
    brute = sum(max(0.0, 0.8 - d(W[a], W[b])) ** 2 for a, b in itertools.permutations(range(5), 2))
    assert float(spreadout(W, 0.8)) == pytest.approx(brute, rel=1e-5)


def test_correlation_top_k_eq11_brute_force():
    torch.manual_seed(2)
    W = torch.randn(3, 4)
    g = correlation_gamma(correlation_sigma(Y)).float()
    brute = 0.0
    for u in range(3):
        near = sorted((d(W[u], W[j]), j) for j in range(3) if j != u)[:1]
        brute += sum(float(g[u, j]) * max(0.0, 1.0 - dist) ** 2 for dist, j in near)
    assert float(correlation_top_k(W, g, 1, 1.0)) == pytest.approx(brute, rel=1e-5)


def test_fixed_reg_eq12_closed_form_equals_per_instance_sum():
    torch.manual_seed(3)
    W = torch.randn(3, 4)
    alpha, beta, nu = 0.7, 1.3, 0.9
    brute = 0.0
    for row in Y:
        P = [i for i in range(3) if row[i] == 1]
        N = [i for i in range(3) if row[i] == 0]
        brute += alpha * sum(d(W[a], W[b]) ** 2 for a in P for b in P if a != b)
        brute += beta * sum(max(0.0, nu - d(W[a], W[b])) ** 2 for a in P for b in N)
    brute /= len(Y)
    A, n_u, n = cooccurrence_counts(Y)
    got = fixed_embedding_reg(W, A, n_u, n, alpha=alpha, beta=beta, margin=nu)
    assert float(got) == pytest.approx(brute, rel=1e-5)


def test_regulariser_step_spreads_nearest_classes():
    torch.manual_seed(4)
    W = F.normalize(torch.randn(20, 8) * 0.5 + torch.ones(8), dim=-1)  # crowded rows (mean cos ≈ 0.8)
    before = float((F.normalize(W, dim=-1) @ F.normalize(W, dim=-1).T).mean())
    for _ in range(50):
        regularizer_step(W, lambda V: spreadout_top_k(V, 3), 0.5)
    after = float((W @ W.T).mean())
    assert after < before - 0.5
    assert torch.allclose(W.norm(dim=1), torch.ones(20), atol=1e-5)  # rows stay on the sphere


def test_spreadout_top_k_outer_sum_over_participating_classes_only():
    torch.manual_seed(5)
    W = torch.randn(6, 4)
    part = torch.tensor([1, 4])
    nn = nearest_classes(W, 2)
    brute = sum(-(d(W[c], W[j]) ** 2) for c in part.tolist() for j in nn[c].tolist())
    assert float(spreadout_top_k(W, 2, classes=part)) == pytest.approx(brute, rel=1e-5)


# ---------------------------------------------------------------- the sparse forms against the dense ones
def _random_sets(n=60, C=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    Ys = (torch.rand(n, C, generator=g) < 0.25).double()
    Ys[0] = 0  # an empty set
    return Ys


@pytest.mark.parametrize("normalize", [True, False])
def test_pair_weights_equal_the_dense_sigma_and_gamma(normalize):
    import scipy.sparse as sp

    from secure_fed.algorithms.regularizers import CorrelationWeights

    Ys = _random_sets()
    Ys[:, 5] = 0  # a label in no set: its γ row has no mass and stays 0
    dense = correlation_sigma(Ys)
    dense = correlation_gamma(dense) if normalize else dense
    w = CorrelationWeights(sp.csr_matrix(Ys.numpy()), normalize=normalize, scale=3.0)
    torch.testing.assert_close(w.dense(), 3.0 * dense, rtol=1e-12, atol=1e-15)


def test_blocked_neighbour_search_equals_the_dense_one(monkeypatch):
    from secure_fed.algorithms import regularizers

    W = torch.randn(37, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    D = regularizers.cosine_distances(W)
    D.fill_diagonal_(float("inf"))
    want = torch.topk(D, 4, dim=1, largest=False).indices
    monkeypatch.setattr(regularizers, "NEIGHBOUR_BLOCK_ELEMENTS", 37 * 5)  # blocks of 5 rows
    assert torch.equal(nearest_classes(W, 4), want)
    rows = torch.tensor([3, 30, 11])
    assert torch.equal(nearest_classes(W, 4, rows=rows), want[rows])


def test_eq11_with_pair_weights_equals_it_with_the_dense_matrix():
    import scipy.sparse as sp

    from secure_fed.algorithms.regularizers import CorrelationWeights

    Ys = _random_sets(C=15)
    W = torch.randn(15, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    dense = 14 * correlation_gamma(correlation_sigma(Ys))
    pairs = CorrelationWeights(sp.csr_matrix(Ys.numpy()), normalize=True, scale=14)
    a, b = W.clone().requires_grad_(True), W.clone().requires_grad_(True)
    ra, rb = correlation_top_k(a, dense, 4, 1.5), correlation_top_k(b, pairs, 4, 1.5)
    ra.backward(), rb.backward()
    assert float(ra) == pytest.approx(float(rb), rel=1e-12)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-13)


def test_eq11_per_set_gradients_over_neighbour_pairs_equal_the_all_pairs_form():
    """The per-set gradients from the C·K neighbour pairs equal the all-pairs form (a (B, C, C) pair-weight tensor
    times the (C, C, d) pair gradients), fp64 ≤ 1e-9, and their sum is the gradient of eq. 11 with σ weights."""
    from secure_fed.algorithms.regularizers import _per_set, label_set_correlation_grads, pair_hinge_grads

    C, k, margin, s = 14, 4, 1.5, 13.0
    Ys = _random_sets(n=25, C=C, seed=5)
    W = torch.randn(C, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    nn_idx = nearest_classes(W, k)
    near = torch.zeros(C, C, dtype=W.dtype)
    near[torch.arange(C).unsqueeze(1), nn_idx] = 1.0
    M = s * Ys.unsqueeze(2) * (1.0 - Ys).unsqueeze(1) * near.unsqueeze(0)
    want = _per_set(M, pair_hinge_grads(W, margin))
    got = label_set_correlation_grads(W, Ys, k=k, margin=margin, scale=s)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert float(got.abs().sum()) > 0
    V = W.clone().requires_grad_(True)
    correlation_top_k(V, s * correlation_sigma(Ys) * Ys.shape[0], k, margin).backward()
    torch.testing.assert_close(got.sum(0), V.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("algorithm", ["fedalc", "fedaws"])
def test_server_step_in_outer_blocks_equals_the_one_expression_step(algorithm, monkeypatch):
    """XC-sized C: eqs. 8 and 11 are summed over blocks of outer classes (bounded pair tensors; eq. 11's gradient by
    hand); the step is the one-expression (autograd) step's, up to the reassociated sums (fp64: 1e-12)."""
    from secure_fed.algorithms import regularizers
    from secure_fed.algorithms.fedalc import FedALC
    from secure_fed.algorithms.fedaws import FedAwS
    from secure_fed.config import load_config

    torch.manual_seed(0)
    C, dim = 40, 6
    # rows of different norms, as clients' training leaves them (FedALC's blocks take the gradient by hand)
    W0 = torch.randn(C, dim, dtype=torch.float64) * (0.5 + torch.rand(C, 1, dtype=torch.float64))
    sets = (torch.rand(60, C) < 0.15).double()
    cfg = load_config(overrides=[f"algorithm.name={algorithm}", "algorithm.k=4", "algorithm.lam=50"]).algorithm
    out, calls = [], []
    real = regularizers.outer_blocks
    for budget in (10**9, 4 * dim * 7):  # one block; blocks of 7 classes
        monkeypatch.setattr(regularizers, "PAIR_BLOCK_ELEMENTS", budget)
        blocks_of = lambda *a: calls.append(len(real(*a))) or real(*a)  # noqa: E731
        monkeypatch.setattr(f"secure_fed.algorithms.{algorithm}.outer_blocks", blocks_of)
        algo = (FedALC if algorithm == "fedalc" else FedAwS)(cfg)
        if algorithm == "fedalc":
            algo.label_sets = regularizers.as_csr(sets)
            algo._build_weights(C)
        W = W0.clone()
        stats = algo.server_step(W, 0, torch.arange(0, C, 2))
        out.append((W, stats["reg"]))
    assert calls[0] == 1 and calls[1] > 1
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-12, atol=1e-12)
    assert out[0][1] == pytest.approx(out[1][1], rel=1e-12)
    assert not torch.allclose(out[0][0], F.normalize(W0, dim=-1))  # the step moved W (beyond renormalising it)


@pytest.mark.parametrize("index", ["hnsw", "ivf", "nndescent"])
def test_approximate_neighbours_find_most_exact_neighbours_and_never_the_class_itself(index):
    """The graph and inverted-file searches on clustered rows (as trained class embeddings are): recall against the
    exact search (counted here from the dense distance matrix, independently) and no class among its own neighbours."""
    from secure_fed.algorithms.regularizers import approximate_nearest_classes, cosine_distances, neighbour_recall

    torch.manual_seed(0)
    C, dim, k = 4000, 32, 10
    centres = F.normalize(torch.randn(200, dim), dim=-1)
    W = F.normalize(centres[torch.randint(0, 200, (C,))] + 0.3 * torch.randn(C, dim) / dim**0.5, dim=-1)
    approx = approximate_nearest_classes(W, k, index=index, nprobe=64, ef_search=64)
    assert approx.shape == (C, k) and not (approx == torch.arange(C)[:, None]).any()
    assert all(len(set(r)) == k for r in approx.tolist())
    D = cosine_distances(W)
    D.fill_diagonal_(float("inf"))
    exact = torch.topk(D, k, dim=1, largest=False).indices
    hits = sum(len(set(a) & set(b)) for a, b in zip(approx.tolist(), exact.tolist(), strict=True))
    assert hits / (C * k) >= 0.9
    rows = torch.arange(0, C, 7)
    brute = sum(len(set(approx[r].tolist()) & set(exact[r].tolist())) for r in rows.tolist()) / (len(rows) * k)
    assert neighbour_recall(W, approx, k, rows) == pytest.approx(brute)


def test_nndescent_builds_on_one_thread_gives_the_same_graph_and_leaves_faiss_threads_as_they_were(monkeypatch):
    """NN-descent on more than one thread gives a graph that depends on the threads' timing (on 10,000 random rows,
    two of three builds on two threads differed; not on every try, so the build's thread count is checked itself):
    built on one thread, the same rows give the same neighbours (a run reproduces and resumes exactly), and faiss's
    thread count is restored after."""
    import faiss

    from secure_fed.algorithms.regularizers import approximate_nearest_classes

    threads_seen = []
    add = faiss.IndexNNDescentFlat.add

    def counting_add(self, *args, **kwargs):
        threads_seen.append(faiss.omp_get_max_threads())
        return add(self, *args, **kwargs)

    monkeypatch.setattr(faiss.IndexNNDescentFlat, "add", counting_add)
    torch.manual_seed(1)
    W = F.normalize(torch.randn(3000, 48), dim=-1)  # random rows: the most ties between near-equal candidates
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        runs = [approximate_nearest_classes(W, 20, index="nndescent") for _ in range(3)]
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)
    assert threads_seen == [1, 1, 1]
    assert all(torch.equal(runs[0], r) for r in runs[1:])


def test_fedalc_with_the_approximate_search_reports_its_recall(tmp_path):
    from secure_fed.engine import Experiment
    from tests.conftest import small_config

    for index in ("hnsw", "ivf", "nndescent"):
        cfg = small_config("algorithm.neighbour_search=approximate", f"algorithm.ann_index={index}", "training.rounds=2")
        exp = Experiment(build_plan(cfg), run_dir=tmp_path / index)
        exp.run(progress=False)
        recalls = [d["neighbour_recall"] for d in exp.diagnostics]
        assert len(recalls) == 2 and all(0.0 <= r <= 1.0 for r in recalls)


def test_eq11_per_set_gradients_from_the_held_labels_pairs_equal_those_from_every_pair():
    """Sets holding a strict subset of the labels: the gradients formed from only those labels' pairs (XC-sized C)
    equal the ones from every class's precomputed pair gradients (fp64, exact index bookkeeping)."""
    from secure_fed.algorithms.regularizers import label_set_correlation_grads, nearest_classes, neighbour_hinge_grads

    torch.manual_seed(3)
    C, dim, k = 30, 6, 4
    W = torch.randn(C, dim, dtype=torch.float64)
    Ys = torch.zeros(5, C, dtype=torch.float64)
    for j, labels in enumerate([[3, 7], [7, 19, 25], [11], [2, 3, 29], [25]]):
        Ys[j, labels] = 1.0
    nn_idx = nearest_classes(W, k)
    full = label_set_correlation_grads(W, Ys, k=k, margin=1.5, scale=2.0, nn_idx=nn_idx,
                                       pair_grads=neighbour_hinge_grads(W, nn_idx, 1.5))  # fmt: skip
    held = label_set_correlation_grads(W, Ys, k=k, margin=1.5, scale=2.0, nn_idx=nn_idx)
    assert full.abs().sum() > 0
    torch.testing.assert_close(held, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("margin", [0.5, 1.0, 1.7])
def test_eq12_in_blocks_and_sparse_pairs_equals_the_dense_closed_form(margin, monkeypatch):
    """reg_fc and its gradient from row blocks (all pairs) and the sparse co-occurring pairs equal autograd of the
    dense closed form (C × C matrices) in fp64; blocks of 5 rows and chunks of 7 pairs, so both loops run often."""
    from secure_fed.algorithms import regularizers as R

    monkeypatch.setattr(R, "NEIGHBOUR_BLOCK_ELEMENTS", 5 * 37)
    monkeypatch.setattr(R, "PAIR_BLOCK_ELEMENTS", 7 * 6)
    torch.manual_seed(1)
    C, dim = 37, 6
    W = torch.randn(C, dim, dtype=torch.float64) * 2
    Y = (torch.rand(60, C) < 0.12).double()
    A, n_u, n_all = R.sparse_cooccurrence(Y)
    Ad, nd, _ = R.cooccurrence_counts(Y)
    Wv = W.clone().requires_grad_(True)
    ref = R.fixed_embedding_reg(Wv, Ad, nd, n_all, alpha=0.7, beta=1.3, margin=margin)
    (g_ref,) = torch.autograd.grad(ref, Wv)
    loss, grad = R.fixed_embedding_loss_grad(W, A, n_u, n_all, alpha=0.7, beta=1.3, margin=margin)
    assert loss == pytest.approx(float(ref.detach()), rel=1e-9)
    torch.testing.assert_close(grad, g_ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("margin", [0.5, 1.7])
def test_eq12_per_set_gradients_without_pair_tensors_equal_the_dense_ones(margin, monkeypatch):
    """Per-label-set eq. 12 gradients from the hinge row sums and each set's own pairs equal the (C, C, d)
    pair-gradient form in fp64, for sets of different sizes and an empty one."""
    from secure_fed.algorithms import regularizers as R

    monkeypatch.setattr(R, "NEIGHBOUR_BLOCK_ELEMENTS", 4 * 29)
    torch.manual_seed(2)
    C, dim = 29, 5
    W = torch.randn(C, dim, dtype=torch.float64)
    Y = torch.zeros(6, C, dtype=torch.float64)
    for j, labels in enumerate([[3, 7], [7, 19, 25, 2], [11], [], [0, 28, 14], [5, 6, 7, 8, 9, 10]]):
        Y[j, labels] = 1.0
    dense = R.label_set_fixed_grads(W, Y, alpha=0.8, beta=1.1, margin=margin)
    sparse = R.label_set_fixed_grads_sparse(W, Y, alpha=0.8, beta=1.1, margin=margin)
    assert dense.abs().sum() > 0 and dense[3].abs().sum() == 0
    torch.testing.assert_close(sparse, dense, rtol=1e-9, atol=1e-12)
