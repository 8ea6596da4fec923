"""Threshold metrics: predictions are ``scores >= threshold`` (0.5 by default).

For the embedding models the scores are cosines in [-1, 1]; the positive loss
pushes positives above 0.9, so 0.5 is a meaningful cut.
"""

from __future__ import annotations

import numpy as np


def threshold_metrics(scores: np.ndarray, y: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """C-P, C-R, C-F1 (per-class, averaged) and O-P, O-R, O-F1 (overall).

    C-F1 is computed from macro precision and recall, ``2·CP·CR/(CP+CR)``, as in
    the FedLGT appendix (not the mean of per-class F1). A class with no predicted
    positive has precision 0; a class with no true positive has recall 0.
    """
    pred = scores >= threshold
    y = y.astype(bool)
    tp = (pred & y).sum(axis=0).astype(float)
    npred = pred.sum(axis=0).astype(float)
    ntrue = y.sum(axis=0).astype(float)
    return threshold_from_counts(tp, npred, ntrue)


def threshold_from_counts(tp: np.ndarray, npred: np.ndarray, ntrue: np.ndarray) -> dict[str, float]:
    """The metrics of :func:`threshold_metrics` (fractions) from per-label counts: true positives, predicted
    positives and positives."""
    cp = float(np.mean(np.divide(tp, npred, out=np.zeros_like(tp), where=npred > 0)))
    cr = float(np.mean(np.divide(tp, ntrue, out=np.zeros_like(tp), where=ntrue > 0)))
    op = float(tp.sum() / npred.sum()) if npred.sum() else 0.0
    orr = float(tp.sum() / ntrue.sum()) if ntrue.sum() else 0.0
    f1 = lambda p, r: 2 * p * r / (p + r) if p + r > 0 else 0.0  # noqa: E731
    return {"C-P": cp, "C-R": cr, "C-F1": f1(cp, cr), "O-P": op, "O-R": orr, "O-F1": f1(op, orr)}
