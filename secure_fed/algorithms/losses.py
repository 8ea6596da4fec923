"""Client-side losses: on normalised scores s = ŵ·ĝ(x) ∈ [-1, 1] (embedding family), or on logits (``bce``, ``asl``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def positive_hinge_loss(scores: torch.Tensor, pos: torch.Tensor, margin: float = 0.9, reduction: str = "mean") -> torch.Tensor:
    """ℓ_pos = max(0, 0.9 − g(x)ᵀw_y)², averaged over positive (instance, label) pairs.

    FedAwS eq. 23 / FedALC eq. 14. ``scores`` is ``(b, k)`` against the k class
    rows the client holds; ``pos`` marks which of those are the instance's labels.
    ``reduction="none"`` gives the (instance, label) terms of the positives (0 elsewhere).
    """
    posf = pos.to(scores.dtype)
    terms = torch.clamp(margin - scores, min=0.0) ** 2 * posf
    return terms if reduction == "none" else terms.sum() / posf.sum().clamp(min=1.0)


def softmax_multilabel_loss(scores: torch.Tensor, pos: torch.Tensor, scale: float = 16.0) -> torch.Tensor:
    """Cross-entropy of softmax(scale·s) against the normalised label vector (oracle only)."""
    posf = pos.to(scores.dtype)
    target = posf / posf.sum(dim=1, keepdim=True).clamp(min=1.0)
    logp = F.log_softmax(scale * scores, dim=1)
    if scores.shape[0] == 1:  # one instance (DP-SGD's per-sample losses, under vmap: no boolean indexing); 0 without a positive
        return -(target * logp).sum()
    has = posf.sum(dim=1) > 0
    return -(target * logp).sum(dim=1)[has].mean()


def contrastive_loss(scores: torch.Tensor, pos: torch.Tensor, margin: float = 0.9, nu: float = 0.9) -> torch.Tensor:
    """FedAwS eq. 12 with cosine distance: (max(0, 0.9 − s_y))² over positives plus
    Σ_{c ∉ Y} max(0, ν − 1 + s_c)² over negatives (oracle only: needs negatives)."""
    posf = pos.to(scores.dtype)
    p = (torch.clamp(margin - scores, min=0.0) ** 2 * posf).sum(dim=1)
    n = (torch.clamp(nu - 1.0 + scores, min=0.0) ** 2 * (1 - posf)).sum(dim=1)
    return (p + n).mean()


def bce_loss(scores: torch.Tensor, pos: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Binary cross-entropy of logits against the full label vectors (families without a row table);
    ``reduction="none"`` gives the (instance, label) terms."""
    return F.binary_cross_entropy_with_logits(scores, pos.to(scores.dtype), reduction=reduction)


def asymmetric_loss(
    scores: torch.Tensor,
    pos: torch.Tensor,
    gamma_pos: float = 0.0,
    gamma_neg: float = 4.0,
    clip: float = 0.05,
    reduction: str = "mean",
) -> torch.Tensor:
    """Asymmetric Loss (Ridnik et al., ICCV 2021) on logits, the FLAG paper's client loss.

    With p = σ(z) and the shifted probability p_m = max(p − clip, 0) of a negative:
    L₊ = (1 − p)^γ₊ · log p for a positive, L₋ = p_m^γ₋ · log(1 − p_m) for a negative (a negative with p ≤ clip
    costs nothing). Defaults are the paper's γ₊ = 0, γ₋ = 4, clip = 0.05. Returns −mean over all (instance, label)
    pairs, as :func:`bce_loss` does (the ASL code sums them: a constant factor); with γ₊ = γ₋ = clip = 0 it is BCE.
    The focusing weights keep their gradient (the loss as the paper defines it). ``reduction="none"`` gives the
    (instance, label) terms.
    """
    z = scores if scores.dtype in (torch.float32, torch.float64) else scores.float()
    posf = pos.to(z.dtype)
    p = torch.sigmoid(z)
    if clip > 0:
        p_m = (p - clip).clamp(min=0.0)
        log_neg = torch.log1p(-p_m)  # p_m ≤ 1 − clip, so finite
    else:
        p_m, log_neg = p, F.logsigmoid(-z)
    loss_pos = (1.0 - p).pow(gamma_pos) * F.logsigmoid(z)
    loss_neg = p_m.pow(gamma_neg) * log_neg
    elem = -(posf * loss_pos + (1.0 - posf) * loss_neg)
    return elem if reduction == "none" else elem.mean()


LOSSES = {
    "positive": positive_hinge_loss,
    "softmax": softmax_multilabel_loss,
    "contrastive": contrastive_loss,
    "bce": bce_loss,
    "asl": asymmetric_loss,
}
