"""Server-side regularisers on the class-embedding matrix W (C × d).

Every function takes raw rows and works on their L2-normalised form with the
cosine distance d(u, v) = 1 − ûᵀv̂ (FedALC eq. 13). Equation numbers refer to
the FedAwS paper (eqs. 7–8) and the FedALC paper (eqs. 9–12).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def cosine_distances(W: torch.Tensor) -> torch.Tensor:
    Wn = F.normalize(W, dim=-1)
    return 1.0 - Wn @ Wn.T


def nearest_classes(W: torch.Tensor, k: int) -> torch.Tensor:
    """Indices ``(C, k)`` of each class's k closest other classes (N_k(c)), no gradient."""
    with torch.no_grad():
        D = cosine_distances(W)
        D.fill_diagonal_(float("inf"))
        return torch.topk(D, min(k, W.shape[0] - 1), dim=1, largest=False).indices


def spreadout(W: torch.Tensor, margin: float) -> torch.Tensor:
    """reg_sp(W) = Σ_c Σ_{c'≠c} max(0, ν − d(w_c, w_c'))²  (FedAwS eq. 7)."""
    D = cosine_distances(W)
    off = ~torch.eye(W.shape[0], dtype=torch.bool, device=W.device)
    return (torch.clamp(margin - D, min=0.0) ** 2)[off].sum()


def spreadout_top_k(W: torch.Tensor, k: int, classes: torch.Tensor | None = None) -> torch.Tensor:
    """reg_sp^top(W) = Σ_{c ∈ 𝔆} Σ_{y ∈ N_k(c)} −d(w_c, w_y)²  (FedAwS eq. 8).

    Stochastic negative mining: each class is pushed away from its k nearest
    classes only. ``classes`` restricts the outer sum (default: all classes).
    """
    nn_idx = nearest_classes(W, k)
    D = cosine_distances(W)
    rows = torch.arange(W.shape[0], device=W.device) if classes is None else classes
    return -(D[rows.unsqueeze(1), nn_idx[rows]] ** 2).sum()


def cooccurrence_counts(label_sets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """From an ``(n_all, C)`` 0/1 matrix of label sets: (A, n_u, n_all), where
    A[u, u'] counts instances with both u and u' (diagonal zeroed) and n_u
    counts instances with u."""
    Y = label_sets.to(torch.float64)
    A = Y.T @ Y
    n_u = A.diagonal().clone()
    A.fill_diagonal_(0.0)
    return A, n_u, int(Y.shape[0])


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


def correlation_top_k(W: torch.Tensor, weights: torch.Tensor, k: int, margin: float) -> torch.Tensor:
    """reg_cr^top(W) = Σ_u Σ_{u' ∈ N_K(u)} γ_uu' · max(0, ν − d(w_u, w_u'))²  (FedALC eq. 11).

    ``weights`` is γ (or σ), already scaled as the caller wants.
    """
    nn_idx = nearest_classes(W, k)
    D = cosine_distances(W)
    rows = torch.arange(W.shape[0], device=W.device).unsqueeze(1)
    g = weights.to(W.dtype)[rows, nn_idx]
    return (g * torch.clamp(margin - D[rows, nn_idx], min=0.0) ** 2).sum()


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
    """Per-label-set gradients (B, C, d) of ℓ_j for eq. 11 with σ weights (eq. 9), label sets Y (B, C).

    ``nn_idx`` and ``pair_grads`` depend on W only; pass them to reuse them across chunks of label sets.
    """
    C = W.shape[0]
    nn_idx = nearest_classes(W, k) if nn_idx is None else nn_idx
    near = torch.zeros(C, C, dtype=W.dtype, device=W.device)
    near[torch.arange(C, device=W.device).unsqueeze(1), nn_idx] = 1.0
    Yf = Y.to(W.dtype)
    M = scale * Yf.unsqueeze(2) * (1.0 - Yf).unsqueeze(1) * near.unsqueeze(0)
    return _per_set(M, pair_hinge_grads(W, margin) if pair_grads is None else pair_grads)


def label_set_fixed_grads(
    W: torch.Tensor, Y: torch.Tensor, *, alpha: float, beta: float, margin: float, pair_grads=None
) -> torch.Tensor:
    """Per-label-set gradients (B, C, d) of ℓ_j for eq. 12."""
    Yf = Y.to(W.dtype)
    eye = torch.eye(W.shape[0], dtype=W.dtype, device=W.device)
    pos = alpha * Yf.unsqueeze(2) * Yf.unsqueeze(1) * (1.0 - eye)
    neg = beta * Yf.unsqueeze(2) * (1.0 - Yf).unsqueeze(1)
    A_sq, A_h = pair_grads if pair_grads is not None else (pair_sqdist_grads(W), pair_hinge_grads(W, margin))
    return _per_set(pos, A_sq) + _per_set(neg, A_h)
