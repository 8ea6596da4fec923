"""Evaluation metrics. :func:`evaluate_scores` returns every metric, in percent."""

from __future__ import annotations

import numpy as np

from secure_fed.metrics.ranking import (
    center_rows,
    macro_average_precision,
    micro_average_precision,
    ndcg_at_k,
    precision_at_k,
)
from secure_fed.metrics.threshold import threshold_metrics


def evaluate_scores(
    scores: np.ndarray,
    y: np.ndarray,
    *,
    ks: tuple[int, ...] = (1, 3, 5),
    threshold: float = 0.5,
    threshold_scores: np.ndarray | None = None,
) -> dict[str, float]:
    """All metrics for an ``(n, L)`` score matrix, as percentages.

    Keys: ``P@k``, ``nDCG@k`` for k in ``ks``; ``mAP`` (macro AP, a.k.a. C-AP);
    ``O-AP`` (micro AP); ``C-P, C-R, C-F1, O-P, O-R, O-F1`` at ``threshold``, read from ``threshold_scores`` when
    given (e.g. the raw scores beside their centred rows, ``evaluation.center_scores``), else from ``scores``.
    """
    y = np.asarray(y)
    out: dict[str, float] = {}
    for k in ks:
        out[f"P@{k}"] = 100 * precision_at_k(scores, y, k)
    for k in ks:
        out[f"nDCG@{k}"] = 100 * ndcg_at_k(scores, y, k)
    out["mAP"] = 100 * macro_average_precision(scores, y)
    out["O-AP"] = 100 * micro_average_precision(scores, y)
    thresholded = scores if threshold_scores is None else threshold_scores
    out.update({k: 100 * v for k, v in threshold_metrics(thresholded, y, threshold).items()})
    return out


__all__ = [
    "center_rows",
    "evaluate_scores",
    "macro_average_precision",
    "micro_average_precision",
    "ndcg_at_k",
    "precision_at_k",
    "threshold_metrics",
]
