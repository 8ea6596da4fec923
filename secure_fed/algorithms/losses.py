"""Client-side losses: on normalised scores s = ŵ·ĝ(x) ∈ [-1, 1] (embedding family), or on logits (``bce``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def positive_hinge_loss(scores: torch.Tensor, pos: torch.Tensor, margin: float = 0.9) -> torch.Tensor:
    """ℓ_pos = max(0, 0.9 − g(x)ᵀw_y)², averaged over positive (instance, label) pairs.

    FedAwS eq. 23 / FedALC eq. 14. ``scores`` is ``(b, k)`` against the k class
    rows the client holds; ``pos`` marks which of those are the instance's labels.
    """
    hinge = torch.clamp(margin - scores, min=0.0) ** 2
    posf = pos.to(scores.dtype)
    return (hinge * posf).sum() / posf.sum().clamp(min=1.0)


def softmax_multilabel_loss(scores: torch.Tensor, pos: torch.Tensor, scale: float = 16.0) -> torch.Tensor:
    """Cross-entropy of softmax(scale·s) against the normalised label vector (oracle only)."""
    posf = pos.to(scores.dtype)
    target = posf / posf.sum(dim=1, keepdim=True).clamp(min=1.0)
    logp = F.log_softmax(scale * scores, dim=1)
    has = posf.sum(dim=1) > 0
    return -(target * logp).sum(dim=1)[has].mean()


def contrastive_loss(scores: torch.Tensor, pos: torch.Tensor, margin: float = 0.9, nu: float = 0.9) -> torch.Tensor:
    """FedAwS eq. 12 with cosine distance: (max(0, 0.9 − s_y))² over positives plus
    Σ_{c ∉ Y} max(0, ν − 1 + s_c)² over negatives (oracle only: needs negatives)."""
    posf = pos.to(scores.dtype)
    p = (torch.clamp(margin - scores, min=0.0) ** 2 * posf).sum(dim=1)
    n = (torch.clamp(nu - 1.0 + scores, min=0.0) ** 2 * (1 - posf)).sum(dim=1)
    return (p + n).mean()


def bce_loss(scores: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of logits against the full label vectors (families without a row table)."""
    return F.binary_cross_entropy_with_logits(scores, pos.to(scores.dtype))


LOSSES = {
    "positive": positive_hinge_loss,
    "softmax": softmax_multilabel_loss,
    "contrastive": contrastive_loss,
    "bce": bce_loss,
}
