"""Ranking metrics for multi-label scores.

``scores`` is an ``(n, L)`` array of real scores and ``y`` an ``(n, L)`` 0/1
array. Percentages are *not* applied here: values are fractions in [0, 1].
"""

from __future__ import annotations

import numpy as np


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Each row's ``k`` best labels, best first; equal scores: the lower label id first (as the blocked
    evaluation in :mod:`secure_fed.metrics.blocks` ranks)."""
    from secure_fed.metrics.blocks import topk_order

    return topk_order(scores, np.broadcast_to(np.arange(scores.shape[1]), scores.shape), k)


def precision_at_k(scores: np.ndarray, y: np.ndarray, k: int) -> float:
    """P@k = (1/k) Σ_{l ∈ top-k} y_l, averaged over instances (FedALC eq. 15)."""
    top = _topk(scores, k)
    return float(np.take_along_axis(y, top, axis=1).sum(axis=1).mean() / k)


def ndcg_at_k(scores: np.ndarray, y: np.ndarray, k: int) -> float:
    """nDCG@k with binary gains, averaged over instances that have ≥ 1 label."""
    top = _topk(scores, k)
    kk = top.shape[1]
    disc = 1.0 / np.log2(np.arange(2, kk + 2))
    dcg = (np.take_along_axis(y, top, axis=1) * disc).sum(axis=1)
    npos = np.minimum(y.sum(axis=1), kk).astype(int)
    idcg = np.concatenate([[0.0], np.cumsum(disc)])[npos]
    ok = idcg > 0
    return float((dcg[ok] / idcg[ok]).mean()) if ok.any() else float("nan")


def _average_precision(score: np.ndarray, y: np.ndarray) -> float:
    """AP of one ranking; ties are broken as scikit-learn does (by distinct thresholds)."""
    order = np.argsort(-score, kind="mergesort")
    s, t = score[order], y[order]
    distinct = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tp = np.cumsum(t)[distinct]
    fp = (distinct + 1) - tp
    precision = tp / (tp + fp)
    recall = tp / tp[-1]
    prev = np.r_[0.0, recall[:-1]]
    return float(np.sum((recall - prev) * precision))


def center_rows(scores: np.ndarray) -> np.ndarray:
    """Each row's scores minus that row's mean over its labels (``evaluation.center_scores``). A per-row shift, so
    every per-instance ranking (P@k, nDCG@k) is unchanged; a label's ranking of the instances (its AP) then compares
    how far the label stands above each instance's mean score, which removes what every label's score shares (for
    cosine scores, the direction of the rows' mean). The engine reads the threshold metrics from the raw scores."""
    return scores - scores.mean(axis=1, keepdims=True, dtype=np.float64).astype(scores.dtype)


def macro_average_precision(scores: np.ndarray, y: np.ndarray) -> float:
    """Mean over labels with ≥ 1 positive of the label's AP (C-AP / mAP)."""
    aps = [_average_precision(scores[:, j], y[:, j]) for j in range(y.shape[1]) if y[:, j].any()]
    return float(np.mean(aps)) if aps else float("nan")


def micro_average_precision(scores: np.ndarray, y: np.ndarray) -> float:
    """AP over all (instance, label) pairs pooled (O-AP)."""
    if not y.any():
        return float("nan")
    return _average_precision(scores.ravel(), y.ravel())
