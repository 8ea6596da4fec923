"""Server-side regularisers on the class-embedding matrix W (C × d).

Every function takes raw rows and works on their L2-normalised form with the
cosine distance d(u, v) = 1 − ûᵀv̂ (FedALC eq. 13). Equation numbers refer to
the FedAwS paper (eqs. 7–8) and the FedALC paper (eqs. 9–12).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from torch.nn import functional as F

from secure_fed.kernel_sizes import NNDESCENT, PAIR_BLOCK_ELEMENTS, ROW_BLOCK_ELEMENTS

#: elements of the (rows × C) distance block the exact neighbour search holds at once
NEIGHBOUR_BLOCK_ELEMENTS = ROW_BLOCK_ELEMENTS


def outer_blocks(rows: torch.Tensor, k: int, dim: int) -> list[torch.Tensor]:
    """``rows`` (the outer classes of eq. 8 or 11) split so that a block's pairs × d stay under
    :data:`PAIR_BLOCK_ELEMENTS`: one block for Bibtex-sized C (the sum as one expression), several for XC data."""
    per = max(1, PAIR_BLOCK_ELEMENTS // max(1, k * dim))
    return [rows] if len(rows) <= per else list(torch.split(rows, per))


def cosine_distances(W: torch.Tensor) -> torch.Tensor:
    """The dense (C, C) matrix of d(w_u, w_v) (eq. 7's all-pairs form and tests; the top-k forms never build it)."""
    Wn = F.normalize(W, dim=-1)
    return 1.0 - Wn @ Wn.T


def pair_distances(W: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """d(w_u, w_v) for the pairs (rows[i], cols[i, j]): shape of ``cols``; differentiable in W."""
    Wn = F.normalize(W, dim=-1)
    # index_select, not advanced indexing: its backward is index_add_, deterministic on CPU, where indexing's
    # backward (index_put_ with accumulate) adds in a thread-dependent order and runs would differ in the last bits
    u = Wn.index_select(0, rows).unsqueeze(1)
    v = Wn.index_select(0, cols.reshape(-1)).view(*cols.shape, W.shape[1])
    return 1.0 - (u * v).sum(-1)


def nearest_classes(W: torch.Tensor, k: int, *, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Indices ``(len(rows), k)`` of each class's k closest other classes (N_k(c)), no gradient; all classes by
    default. Exact: blocks of rows against all of W (a blocked matmul and ``torch.topk``), so memory is
    O(block × C) and never C × C."""
    C = W.shape[0]
    rows = torch.arange(C, device=W.device) if rows is None else rows
    k = min(k, C - 1)
    block = max(1, NEIGHBOUR_BLOCK_ELEMENTS // max(C, 1))
    with torch.no_grad():
        Wn = F.normalize(W, dim=-1)
        out = []
        for s in range(0, len(rows), block):
            r = rows[s : s + block]
            D = 1.0 - Wn[r] @ Wn.T
            D[torch.arange(len(r), device=W.device), r] = float("inf")
            out.append(torch.topk(D, k, dim=1, largest=False).indices)
        return torch.cat(out) if out else torch.zeros(0, k, dtype=torch.int64, device=W.device)


def approximate_nearest_classes(
    W: torch.Tensor,
    k: int,
    *,
    index: str = "hnsw",
    nprobe: int = 64,
    ef_search: int = 64,
    hnsw_m: int = 32,
    ef_construction: int = 80,
) -> torch.Tensor:
    """N_k(c) for every class from an approximate index over the normalised rows (inner product = cosine), for label
    counts where the exact search (C² · d work) is too slow. ``index``:

    * ``"hnsw"``: a graph index (faiss ``IndexHNSWFlat``, ``hnsw_m`` links a node, ``ef_construction`` candidates
      while inserting, ``ef_search`` a query): ~C·log C on structured rows;
    * ``"ivf"``: an inverted-file index (faiss ``IndexIVFFlat``, ⌈4·√C⌉ lists but at most C/40, trained on an evenly
      spaced sample of rows, ``nprobe`` lists searched a query): ~C^1.5;
    * ``"nndescent"``: the k-NN graph of the rows itself (faiss ``IndexNNDescentFlat``, NN-descent of Dong et al.
      2011: each row's neighbours improved from its neighbours' neighbours; settings in
      :data:`~secure_fed.kernel_sizes.NNDESCENT`), no separate search; built on one thread, since with more the graph
      depends on their timing (a run would neither reproduce nor resume exactly). For C ≤ its degree + 1, the
      exact search.

    Rows for which the index returns fewer than k other classes get the exact search. :func:`neighbour_recall`
    measures it against the exact search. No gradient."""
    import faiss  # declared dependency (faiss-cpu); imported here, where the approximate search is asked for

    C, d = W.shape
    k = min(k, C - 1)
    with torch.no_grad():
        X = np.ascontiguousarray(F.normalize(W.detach().float(), dim=-1).cpu().numpy())
    if index == "hnsw":
        graph = faiss.IndexHNSWFlat(d, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = ef_construction
        graph.add(X)
        graph.hnsw.efSearch = max(ef_search, k + 1)
        _, found = graph.search(X, k + 1)
    elif index == "ivf":
        nlist = max(1, min(C // 40, int(np.ceil(4 * np.sqrt(C)))))
        ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        sample = X[np.linspace(0, C - 1, num=min(C, 64 * nlist)).astype(np.int64)]
        ivf.train(sample)
        ivf.add(X)
        ivf.nprobe = min(nprobe, nlist)
        _, found = ivf.search(X, k + 1)
    elif index == "nndescent":
        degree = max(NNDESCENT["degree"], k + 1)
        if C <= degree + 1:
            return nearest_classes(W, k)
        nnd = faiss.IndexNNDescentFlat(d, degree, faiss.METRIC_INNER_PRODUCT)
        nnd.nndescent.S, nnd.nndescent.R, nnd.nndescent.iter = NNDESCENT["samples"], NNDESCENT["reverse"], NNDESCENT["iterations"]
        nnd.nndescent.L = degree + NNDESCENT["pool_extra"]
        threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)
        try:
            nnd.add(X)
        finally:
            faiss.omp_set_num_threads(threads)
        # each row's neighbours, nearest first, never the row itself: the first k + 1 columns, as a search returns
        found = faiss.vector_to_array(nnd.nndescent.final_graph).reshape(C, degree)[:, : k + 1].astype(np.int64)
    else:
        raise ValueError(f"unknown approximate index {index!r} (hnsw, ivf, nndescent)")
    own = found == np.arange(C)[:, None]
    # drop each row's own class (or, when it was not found, the farthest hit)
    keep = ~own
    keep[~own.any(axis=1), k] = False
    out = found[keep].reshape(C, k)  # faiss returns distinct ids per query: exactly k kept in every row
    short = np.flatnonzero((out < 0).any(axis=1))
    result = torch.from_numpy(out.astype(np.int64)).to(W.device)
    if len(short):
        rows = torch.from_numpy(short).to(W.device)
        result[rows] = nearest_classes(W, k, rows=rows)
    return result


def neighbour_recall(W: torch.Tensor, approx: torch.Tensor, k: int, rows: torch.Tensor) -> float:
    """Share of the exact k nearest classes of ``rows`` that the approximate search ``approx`` (all classes'
    neighbours) also found: |approx ∩ exact| / (k · len(rows))."""
    exact = nearest_classes(W, k, rows=rows).cpu().numpy()
    got = approx[rows].cpu().numpy()
    hits = sum(len(np.intersect1d(a, b)) for a, b in zip(got, exact, strict=True))
    return hits / max(1, exact.size)


def spreadout(W: torch.Tensor, margin: float) -> torch.Tensor:
    """reg_sp(W) = Σ_c Σ_{c'≠c} max(0, ν − d(w_c, w_c'))²  (FedAwS eq. 7)."""
    D = cosine_distances(W)
    off = ~torch.eye(W.shape[0], dtype=torch.bool, device=W.device)
    return (torch.clamp(margin - D, min=0.0) ** 2)[off].sum()


def spreadout_top_k(
    W: torch.Tensor, k: int, classes: torch.Tensor | None = None, *, nn_idx: torch.Tensor | None = None
) -> torch.Tensor:
    """reg_sp^top(W) = Σ_{c ∈ 𝔆} Σ_{y ∈ N_k(c)} −d(w_c, w_y)²  (FedAwS eq. 8).

    Stochastic negative mining: each class is pushed away from its k nearest
    classes only. ``classes`` restricts the outer sum (default: all classes); ``nn_idx`` gives their N_k(c)
    (default: the exact search on ``W``).
    """
    rows = torch.arange(W.shape[0], device=W.device) if classes is None else classes
    nn_idx = nearest_classes(W, k, rows=rows) if nn_idx is None else nn_idx
    return -(pair_distances(W, rows, nn_idx) ** 2).sum()


def as_csr(label_sets) -> sp.csr_matrix:
    """Label sets (a scipy sparse matrix, or a dense 0/1 tensor or array) as a float64 CSR matrix."""
    if sp.issparse(label_sets):
        return sp.csr_matrix(label_sets, dtype=np.float64)
    if isinstance(label_sets, torch.Tensor):
        label_sets = label_sets.detach().cpu().numpy()
    return sp.csr_matrix(np.asarray(label_sets, dtype=np.float64))


def sparse_cooccurrence(label_sets) -> tuple[sp.csr_matrix, np.ndarray, int]:
    """(A, n_u, n_all) with A the sparse co-occurrence counts (diagonal removed: only pairs that occur are
    stored), n_u each label's count and n_all the number of sets: ``Yᵀ Y`` on CSR, O(Σ_j |L_j|²) work."""
    Y = as_csr(label_sets)
    A = (Y.T @ Y).tocsr()
    n_u = A.diagonal().copy()
    A = (A - sp.diags(n_u, format="csr")).tocsr()
    A.eliminate_zeros()
    A.sort_indices()
    return A, n_u, int(Y.shape[0])


def cooccurrence_counts(label_sets) -> tuple[torch.Tensor, torch.Tensor, int]:
    """From an ``(n_all, C)`` 0/1 matrix of label sets: (A, n_u, n_all), where
    A[u, u'] counts instances with both u and u' (diagonal zeroed) and n_u
    counts instances with u. Dense (C, C): eq. 12's all-pairs form (FedALC-fixed) and tests."""
    A, n_u, n_all = sparse_cooccurrence(label_sets)
    return torch.from_numpy(A.toarray()), torch.from_numpy(n_u), n_all


class CorrelationWeights:
    """σ (eq. 9) or γ (eq. 10), times ``scale``, looked up at any pairs without a C × C matrix.

    σ_uv = (n_u − A_uv)/n_all (σ_uu = 0) and γ_uv = σ_uv / Σ_{v'≠u} σ_uv', whose row mass is
    ((C − 1)·n_u − Σ_v A_uv)/n_all in closed form; A is the sparse co-occurrence matrix, looked up by binary
    search in its sorted (u·C + v) keys. Memory O(pairs that occur + C)."""

    def __init__(self, label_sets, *, normalize: bool, scale: float):
        A, n_u, n_all = sparse_cooccurrence(label_sets)
        C = A.shape[0]
        self.num_labels, self.n_all, self.normalize, self.scale = C, max(n_all, 1), normalize, float(scale)
        self.n_u = n_u
        rows = np.repeat(np.arange(C, dtype=np.int64), np.diff(A.indptr))
        self.keys = rows * C + A.indices.astype(np.int64)  # sorted: rows ascending, indices sorted within a row
        self.counts = A.data
        self.mass = ((C - 1) * n_u - np.asarray(A.sum(axis=1)).ravel()) / self.n_all

    def at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The weights of pairs (rows[i], cols[i, j]), shape of ``cols`` (float64, on ``cols``' device)."""
        r = rows.detach().cpu().numpy().astype(np.int64)[:, None]
        c = cols.detach().cpu().numpy().astype(np.int64)
        key = r * self.num_labels + c
        pos = np.minimum(np.searchsorted(self.keys, key), max(len(self.keys) - 1, 0))
        a = np.where(self.keys[pos] == key, self.counts[pos], 0.0) if len(self.keys) else np.zeros(key.shape)
        sigma = np.where(r == c, 0.0, (self.n_u[r] - a) / self.n_all)
        if self.normalize:
            m = np.broadcast_to(self.mass[r], sigma.shape)
            sigma = np.divide(sigma, m, out=np.zeros_like(sigma), where=m > 0)
        return torch.from_numpy(self.scale * sigma).to(cols.device)

    def dense(self) -> torch.Tensor:
        """The (C, C) matrix (tests and small C only)."""
        C = self.num_labels
        idx = torch.arange(C)
        return self.at(idx, idx.unsqueeze(0).expand(C, C))


def correlation_sigma(label_sets: torch.Tensor) -> torch.Tensor:
    """σ_uu' = (1/n_all) Σ_j I(u ∈ L_j^P and u' ∈ L_j^N)  (FedALC eq. 9); σ_uu = 0."""
    A, n_u, n_all = cooccurrence_counts(label_sets)
    sigma = (n_u.unsqueeze(1) - A) / max(n_all, 1)
    sigma.fill_diagonal_(0.0)
    return sigma


def correlation_gamma(sigma: torch.Tensor) -> torch.Tensor:
    """γ_uu' = σ_uu' / Σ_{u'≠u} σ_uu'  (FedALC eq. 10); rows with zero mass stay 0."""
    mass = sigma.sum(dim=1, keepdim=True)
    return torch.where(mass > 0, sigma / mass.clamp(min=1e-300), torch.zeros_like(sigma))


def _pair_weights(
    weights: CorrelationWeights | torch.Tensor, rows: torch.Tensor, nn_idx: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """γ (or σ) at the pairs (rows[i], nn_idx[i, j]), shape of ``nn_idx``: looked up, or read from a dense (C, C)."""
    if isinstance(weights, CorrelationWeights):
        return weights.at(rows, nn_idx).to(dtype)
    return weights.to(dtype)[rows.unsqueeze(1), nn_idx]


def correlation_top_k(
    W: torch.Tensor,
    weights: torch.Tensor,
    k: int,
    margin: float,
    *,
    rows: torch.Tensor | None = None,
    nn_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """reg_cr^top(W) = Σ_u Σ_{u' ∈ N_K(u)} γ_uu' · max(0, ν − d(w_u, w_u'))²  (FedALC eq. 11).

    ``weights`` is γ (or σ), already scaled as the caller wants: a dense (C, C) tensor or a
    :class:`CorrelationWeights` (looked up at the C·K pairs only). ``rows`` restricts the outer sum to those
    classes u (default: all); ``nn_idx`` gives their N_K(u) (default: the exact search; e.g.
    :func:`approximate_nearest_classes` for very large C). Differentiable in W (the one-expression step and the
    tests' reference); XC-sized C steps in blocks with :func:`correlation_top_k_grad` instead.
    """
    rows = torch.arange(W.shape[0], device=W.device) if rows is None else rows
    nn_idx = nearest_classes(W, k, rows=rows) if nn_idx is None else nn_idx
    g = _pair_weights(weights, rows, nn_idx, W.dtype)
    return (g * torch.clamp(margin - pair_distances(W, rows, nn_idx), min=0.0) ** 2).sum()


def correlation_top_k_grad(
    W: torch.Tensor,
    weights: CorrelationWeights | torch.Tensor,
    margin: float,
    *,
    rows: torch.Tensor,
    nn_idx: torch.Tensor,
    out: torch.Tensor,
    norms: torch.Tensor | None = None,
) -> float:
    """Eq. 11's terms of the outer classes ``rows`` (with their N_K(u) ``nn_idx``): adds their gradient in W to
    ``out`` and returns their value. By hand, no autograd graph: with d_uv = 1 − ŵ_u·ŵ_v and
    c_uv = 2 γ_uv max(0, ν − d_uv) = ∂/∂(ŵ_u·ŵ_v),

        ∂/∂w_u = (I − ŵ_u ŵ_uᵀ) Σ_v c_uv ŵ_v / ‖w_u‖,    ∂/∂w_v += (I − ŵ_v ŵ_vᵀ) c_uv ŵ_u / ‖w_v‖,

    equal to autograd of :func:`correlation_top_k` (tested in fp64). It gathers the block's neighbour rows once
    (pairs × d) where autograd keeps several such tensors and scatters them back through ``index_select``'s
    backward: 3× faster at 13,330 labels and 5× at 131,072 (d = 512, K = 50). ``norms``: the rows' norms (computed
    when not given)."""
    d = W.shape[1]
    b, k = nn_idx.shape
    norms = W.norm(dim=-1).clamp(min=1e-12) if norms is None else norms
    flat = nn_idx.reshape(-1)
    u = W.index_select(0, rows) / norms.index_select(0, rows).unsqueeze(1)
    v_norms = norms.index_select(0, flat).view(b, k, 1)
    v = W.index_select(0, flat).view(b, k, d).div_(v_norms)
    cos = torch.bmm(v, u.unsqueeze(2)).squeeze(2)
    g = _pair_weights(weights, rows, nn_idx, W.dtype)
    hinge = torch.clamp(margin - (1.0 - cos), min=0.0)
    value = float((g * hinge**2).sum())
    c = 2.0 * g * hinge
    grad_u = torch.bmm(c.unsqueeze(1), v).squeeze(1)
    grad_u = (grad_u - (grad_u * u).sum(-1, keepdim=True) * u) / norms.index_select(0, rows).unsqueeze(1)
    # c_uv ŵ_u projected off ŵ_v: c_uv (ŵ_u − cos_uv ŵ_v), in place of v
    grad_v = v.mul_(-cos.unsqueeze(2)).add_(u.unsqueeze(1)).mul_(c.unsqueeze(2) / v_norms)
    out.index_add_(0, rows, grad_u)
    out.index_add_(0, flat, grad_v.view(-1, d))
    return value


def fixed_embedding_reg(
    W: torch.Tensor, A: torch.Tensor, n_u: torch.Tensor, n_all: int, *, alpha: float, beta: float, margin: float
) -> torch.Tensor:
    """reg_fc(W)  (FedALC eq. 12), summed over instances in closed form.

    (1/n_all) Σ_j [ α Σ_{y≠y' ∈ L_j^P} d(w_y, w_y')² + β Σ_{y ∈ L_j^P, y' ∈ L_j^N} max(0, ν − d(w_y, w_y'))² ]
    = (1/n_all) Σ_{u≠u'} [ α A_uu' d_uu'² + β (n_u − A_uu') max(0, ν − d_uu')² ].
    """
    D = cosine_distances(W)
    A = A.to(W.dtype)
    neg = (n_u.to(W.dtype).unsqueeze(1) - A).clamp(min=0.0)
    off = 1.0 - torch.eye(W.shape[0], dtype=W.dtype, device=W.device)
    pos_term = alpha * (A * D**2 * off).sum()
    neg_term = beta * (neg * torch.clamp(margin - D, min=0.0) ** 2 * off).sum()
    return (pos_term + neg_term) / max(n_all, 1)


def _unit_rows(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ŵ, ‖w‖) of every row (norms clamped as ``F.normalize`` does)."""
    norms = W.norm(dim=-1).clamp(min=1e-12)
    return W / norms.unsqueeze(1), norms


def _row_blocks(C: int, device) -> tuple[torch.Tensor, ...]:
    """The row indices of each block of a (block × C) matrix under :data:`NEIGHBOUR_BLOCK_ELEMENTS`."""
    return torch.arange(C, device=device).split(max(1, NEIGHBOUR_BLOCK_ELEMENTS // max(C, 1)))


def fixed_embedding_loss_grad(
    W: torch.Tensor, A: sp.csr_matrix, n_u: np.ndarray, n_all: int, *, alpha: float, beta: float, margin: float
) -> tuple[float, torch.Tensor]:
    """reg_fc(W) (FedALC eq. 12) and its gradient, never a C × C matrix: memory O(block × C + pairs chunk + C·d).

    With c_uv = ŵ_u·ŵ_v, d_uv = 1 − c_uv and h_uv = max(0, ν − d_uv)², the closed form of
    :func:`fixed_embedding_reg` splits as

        n_all · reg_fc = β Σ_u n_u Σ_{v≠u} h_uv  +  Σ_{(u,v): A_uv>0} A_uv (α d_uv² − β h_uv)

    The first sum runs over every pair (the β term pushes each label from every label it does not co-occur with, so
    its work is C²·d by definition) in blocks of rows; the second over the sparse co-occurring pairs ``A`` (CSR
    counts, diagonal removed, from :func:`sparse_cooccurrence`) in chunks. ∂/∂c_uv is formed by hand and mapped to
    W through ŵ = w/‖w‖; tested against autograd of the dense closed form in fp64."""
    C, d = W.shape
    with torch.no_grad():
        Wn, norms = _unit_rows(W)
        n = torch.as_tensor(np.asarray(n_u), dtype=W.dtype, device=W.device)
        g_hat = torch.zeros_like(W)  # ∂ loss / ∂ŵ
        total = 0.0
        for r in _row_blocks(C, W.device):  # β Σ_u n_u Σ_{v≠u} h_uv; ∂/∂c_uv = β n_u m_uv, m_uv = 2 max(0, ν − d_uv)
            hinge = torch.clamp(margin - (1.0 - Wn[r] @ Wn.T), min=0.0)
            hinge[torch.arange(len(r), device=W.device), r] = 0.0
            total += beta * float((n[r].unsqueeze(1) * hinge**2).sum())
            # c is symmetric, so row r's gradient gathers both orders of its pairs: β (n_r + n_v) m_rv
            g_hat[r] += (beta * 2.0 * hinge * (n[r].unsqueeze(1) + n.unsqueeze(0))) @ Wn
        A = sp.csr_matrix(A)
        rows_of = np.repeat(np.arange(C, dtype=np.int64), np.diff(A.indptr))
        chunk = max(1, PAIR_BLOCK_ELEMENTS // max(d, 1))
        for s in range(0, A.nnz, chunk):  # Σ A_uv (α d² − β h) over the ordered co-occurring pairs
            u = torch.from_numpy(rows_of[s : s + chunk]).to(W.device)
            v = torch.from_numpy(A.indices[s : s + chunk].astype(np.int64)).to(W.device)
            a = torch.from_numpy(np.asarray(A.data[s : s + chunk])).to(W.device, W.dtype)
            c = (Wn[u] * Wn[v]).sum(-1)
            dist, hinge = 1.0 - c, torch.clamp(margin - (1.0 - c), min=0.0)
            total += float((a * (alpha * dist**2 - beta * hinge**2)).sum())
            dc = -a * (2.0 * alpha * dist + 2.0 * beta * hinge)  # ∂/∂c_uv of A_uv (α d² − β h)
            g_hat.index_add_(0, u, dc.unsqueeze(1) * Wn[v])
            g_hat.index_add_(0, v, dc.unsqueeze(1) * Wn[u])
        g_hat /= max(n_all, 1)
        grad = (g_hat - (g_hat * Wn).sum(-1, keepdim=True) * Wn) / norms.unsqueeze(1)
    return total / max(n_all, 1), grad


# --------------------------------------------------------------------------------------------
# Per-label-set forms (for DP-SGD on the server's W update, protocols/dp/label_set_dpsgd.py).
#
# Both FedALC regularisers are sums over label sets j with per-set terms on pairs (u, v):
#   eq. 11 (σ weights, eq. 9):  ℓ_j = s Σ_{u ∈ L_j} Σ_{v ∈ N_K(u) \ L_j} max(0, ν − d_uv)²
#   eq. 12:                     ℓ_j = α Σ_{u ≠ v ∈ L_j} d_uv² + β Σ_{u ∈ L_j, v ∉ L_j} max(0, ν − d_uv)²
# so reg(W) = (1/n_all) Σ_j ℓ_j. With A[u, v] = ∂h(w_u, w_v)/∂w_u for a symmetric pair term h,
# ∇_{w_r} ℓ_j = Σ_v (M_j[r, v] + M_j[v, r]) A[r, v], where M_j[u, v] weights pair (u, v) in set j.
# --------------------------------------------------------------------------------------------


def _cos_grads(W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(c, ∂c_uv/∂w_u) with c_uv = ŵ_u·ŵ_v: shapes (C, C) and (C, C, d)."""
    norms = W.norm(dim=-1).clamp(min=1e-12)
    Wn = W / norms.unsqueeze(1)
    c = Wn @ Wn.T
    dc = (Wn.unsqueeze(0) - c.unsqueeze(2) * Wn.unsqueeze(1)) / norms.view(-1, 1, 1)
    return c, dc


def pair_hinge_grads(W: torch.Tensor, margin: float) -> torch.Tensor:
    """A[u, v] = ∂/∂w_u max(0, ν − d(w_u, w_v))², shape (C, C, d)."""
    c, dc = _cos_grads(W)
    m = torch.clamp(margin - (1.0 - c), min=0.0)
    return 2.0 * m.unsqueeze(2) * dc


def pair_sqdist_grads(W: torch.Tensor) -> torch.Tensor:
    """A[u, v] = ∂/∂w_u d(w_u, w_v)², shape (C, C, d)."""
    c, dc = _cos_grads(W)
    return -2.0 * (1.0 - c).unsqueeze(2) * dc


def neighbour_hinge_grads(
    W: torch.Tensor, nn_idx: torch.Tensor, margin: float, *, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For the pairs (u, v = nn_idx[i, k]) only, u = rows[i] (all classes by default): (∂h/∂w_u, ∂h/∂w_v) of
    h = max(0, ν − d(w_u, w_v))², each (len(rows), K, d). Eq. 11's per-set gradients need no other pair, so no
    (C, C, d) tensor is built."""
    norms = W.norm(dim=-1).clamp(min=1e-12)
    Wn = W / norms.unsqueeze(1)
    nu = norms if rows is None else norms[rows]
    Wu, Wv = (Wn if rows is None else Wn[rows]).unsqueeze(1), Wn[nn_idx]  # (m, 1, d), (m, K, d)
    c = (Wu * Wv).sum(-1, keepdim=True)  # (m, K, 1)
    m2 = 2.0 * torch.clamp(margin - (1.0 - c), min=0.0)
    return m2 * (Wv - c * Wu) / nu.view(-1, 1, 1), m2 * (Wu - c * Wv) / norms[nn_idx].unsqueeze(-1)


def _per_set(M: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """(B, C, C) pair weights × (C, C, d) pair gradients → (B, C, d) per-set gradients."""
    Ms = (M + M.transpose(1, 2)).to(A.dtype)
    return torch.bmm(Ms.permute(1, 0, 2), A).permute(1, 0, 2)


def label_set_correlation_grads(
    W: torch.Tensor,
    Y: torch.Tensor,
    *,
    k: int,
    margin: float,
    scale: float,
    nn_idx: torch.Tensor | None = None,
    pair_grads: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Per-label-set gradients (B, C, d) of ℓ_j for eq. 11 with σ weights (eq. 9), label sets Y (B, C).

    Only the pairs (u ∈ L_j, v ∈ N_K(u) \ L_j) enter: u gets ∂h/∂w_u and v gets ∂h/∂w_v of each (scaled by s),
    from :func:`neighbour_hinge_grads` — memory O(C·K·d + B·C·d), never O(C²·d). ``nn_idx`` and ``pair_grads``
    (that function's pair for every class) depend on W only; pass them to reuse them across chunks of label sets.
    Without ``pair_grads`` only the pairs of the labels the sets hold are formed (XC-sized C·K·d).
    """
    B, (C, d) = Y.shape[0], W.shape
    nn_idx = nearest_classes(W, k) if nn_idx is None else nn_idx
    Yb = Y.to(W.device) != 0
    b_idx, u_idx = Yb.nonzero(as_tuple=True)  # (set, label) memberships
    if pair_grads is None:  # only the pairs of the labels these sets hold: O(labels held · K · d)
        held, at = torch.unique(u_idx, return_inverse=True)
        Au, Av = neighbour_hinge_grads(W, nn_idx[held], margin, rows=held)
    else:
        (Au, Av), at = pair_grads, u_idx
    v_idx = nn_idx[u_idx]  # (m, K)
    active = (~Yb[b_idx.unsqueeze(1), v_idx]).to(W.dtype).unsqueeze(-1)  # v ∉ L_j
    G = torch.zeros(B * C, d, dtype=W.dtype, device=W.device)  # index_add_: deterministic on CPU (index_put_ is not)
    G.index_add_(0, b_idx * C + u_idx, scale * (active * Au[at]).sum(1))
    G.index_add_(0, (b_idx.unsqueeze(1) * C + v_idx).reshape(-1), scale * (active * Av[at]).reshape(-1, d))
    return G.view(B, C, d)


def hinge_grad_row_sums(W: torch.Tensor, margin: float) -> torch.Tensor:
    """S (C, d) with S_r = Σ_{v≠r} ∂/∂w_r max(0, ν − d(w_r, w_v))² (the row sums of :func:`pair_hinge_grads`), in
    blocks of rows: memory O(block × C), never C × C × d."""
    C = W.shape[0]
    with torch.no_grad():
        Wn, norms = _unit_rows(W)
        S = torch.empty_like(W)
        for r in _row_blocks(C, W.device):
            c = Wn[r] @ Wn.T
            m = 2.0 * torch.clamp(margin - (1.0 - c), min=0.0)
            m[torch.arange(len(r), device=W.device), r] = 0.0
            S[r] = (m @ Wn - (m * c).sum(1, keepdim=True) * Wn[r]) / norms[r].unsqueeze(1)
    return S


def label_set_fixed_grads_sparse(
    W: torch.Tensor, Y: torch.Tensor, *, alpha: float, beta: float, margin: float, row_sums: torch.Tensor | None = None
) -> torch.Tensor:
    r"""Per-label-set gradients (B, C, d) of ℓ_j for eq. 12 without (C, C, d) pair gradients.

    For set j with labels L_j and T_jr = Σ_{u ∈ L_j, u≠r} ∂h(w_r, w_u)/∂w_r (h the hinge):
    row r ∉ L_j gets β T_jr (it is pushed by each label of the set); row r ∈ L_j gets
    β (S_r − T_jr) + 2α Σ_{v ∈ L_j, v≠r} ∂d(w_r, w_v)²/∂w_r, with S the hinge row sums over all labels
    (:func:`hinge_grad_row_sums`, computed once a step: pass it as ``row_sums``). Work O(B·C·m·d) for sets of at
    most m labels, memory O(B·C·(m + d)). Equal to :func:`label_set_fixed_grads` (tested in fp64)."""
    B, C = Y.shape[0], W.shape[0]
    Yb = Y.to(W.device) != 0
    S = hinge_grad_row_sums(W, margin) if row_sums is None else row_sums
    with torch.no_grad():
        Wn, norms = _unit_rows(W)
        sizes = Yb.sum(1)
        m = max(1, int(sizes.max())) if B else 1
        b_idx, u_idx = Yb.nonzero(as_tuple=True)
        slot = torch.arange(len(b_idx), device=W.device) - torch.repeat_interleave(
            torch.cumsum(sizes, 0) - sizes, sizes, output_size=len(b_idx)
        )  # position of each label within its set
        lab = torch.full((B, m), -1, dtype=torch.int64, device=W.device)
        lab[b_idx, slot] = u_idx
        valid = lab >= 0
        Wl = torch.where(valid.unsqueeze(-1), Wn[lab.clamp(min=0)], torch.zeros((), dtype=W.dtype, device=W.device))
        c = torch.einsum("rd,bmd->brm", Wn, Wl)  # (B, C, m): ŵ_r · ŵ_u for the set's labels u
        h = 2.0 * torch.clamp(margin - (1.0 - c), min=0.0) * valid.unsqueeze(1)
        h[b_idx, u_idx, slot] = 0.0  # u = r: no pair
        T = (torch.bmm(h, Wl) - (h * c).sum(-1, keepdim=True) * Wn.unsqueeze(0)) / norms.view(1, C, 1)
        G = beta * T
        # rows of the set's own labels: β (S_r − T_jr) in place of β T_jr, plus the α pull towards the set's others
        P = torch.bmm(Wl, Wl.transpose(1, 2))  # (B, m, m)
        q = -2.0 * (1.0 - P) * (valid.unsqueeze(1) & valid.unsqueeze(2))
        q[:, torch.arange(m), torch.arange(m)] = 0.0
        own = Wl  # (B, m, d): ŵ of each slot's label
        pull = (torch.bmm(q, Wl) - (q * P).sum(-1, keepdim=True) * own)[b_idx, slot] / norms[u_idx].unsqueeze(1)
        G[b_idx, u_idx] += beta * (S[u_idx] - 2.0 * T[b_idx, u_idx]) + 2.0 * alpha * pull
    return G


def label_set_fixed_grads(
    W: torch.Tensor, Y: torch.Tensor, *, alpha: float, beta: float, margin: float, pair_grads=None
) -> torch.Tensor:
    """Per-label-set gradients (B, C, d) of ℓ_j for eq. 12 from the dense (C, C, d) pair gradients (the reference
    form, small C and tests; the algorithm uses :func:`label_set_fixed_grads_sparse`)."""
    Yf = Y.to(W.dtype)
    eye = torch.eye(W.shape[0], dtype=W.dtype, device=W.device)
    pos = alpha * Yf.unsqueeze(2) * Yf.unsqueeze(1) * (1.0 - eye)
    neg = beta * Yf.unsqueeze(2) * (1.0 - Yf).unsqueeze(1)
    A_sq, A_h = pair_grads if pair_grads is not None else (pair_sqdist_grads(W), pair_hinge_grads(W, margin))
    return _per_set(pos, A_sq) + _per_set(neg, A_h)
