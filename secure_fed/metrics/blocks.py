"""Every metric of :func:`~secure_fed.metrics.evaluate_scores` from blocks of label columns, in bounded memory.

An extreme-classification test split has far more score entries than a machine holds (Amazon-670K: 2,000 test
rows × 670,091 labels ≈ 5.4 GB of float32), so :func:`evaluate_label_blocks` never forms the ``(n, C)`` matrix. It
asks a callback for the scores of one block of label columns at a time (all test rows × ``block`` labels) and keeps:

* ``P@k`` / ``nDCG@k``: a running top-k per row, merged block by block (ties: the lower label id first);
* ``mAP`` (macro AP): each column's AP, computed when its block is seen (a column is a label: all its scores are
  in that block);
* ``C-/O- P, R, F1``: per-label counts of predictions at the threshold, true positives and positives;
* ``O-AP`` (micro AP over every (row, label) pair): a second pass over the blocks. The first pass collects the
  positives' scores; AP needs, at each distinct positive score t, how many of *all* scores are ≥ t, which the
  second pass counts with a sorted search. This is exact, ties included (scikit-learn's convention: one
  precision per distinct threshold).

Memory is O(n · block + n · k + nnz(y)); the values equal :func:`evaluate_scores` on the full matrix (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from secure_fed.metrics.threshold import threshold_from_counts

#: one block's score entries at most: :func:`label_block_size` sizes blocks to this. A block's AP needs about
#: :data:`BYTES_PER_SCORE` bytes an entry (the scores, their sort order, cumulative counts), so 2^23 entries ≈ 0.6 GB
BLOCK_ELEMENTS = 2**23
#: working memory of one score entry in a block (float32 score, int64 sort order, float64 counts and their temporaries)
BYTES_PER_SCORE = 72


def label_block_size(num_rows: int, num_labels: int, *, elements: int = BLOCK_ELEMENTS) -> int:
    """Labels per block so that one block of ``num_rows`` rows holds at most ``elements`` scores (at least 1)."""
    return max(1, min(num_labels, elements // max(1, num_rows)))


def topk_order(scores: np.ndarray, ids: np.ndarray, k: int) -> np.ndarray:
    """Positions of each row's ``k`` highest scores, best first; equal scores: the lower id first.

    ``scores`` and ``ids`` are ``(n, m)``; ``ids`` are the columns' label ids (distinct within a row)."""
    k = min(k, scores.shape[1])
    if k < scores.shape[1]:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        kth = np.take_along_axis(scores, part, axis=1).min(axis=1, keepdims=True)
        # ties at the k-th score: argpartition picks among them arbitrarily; take every tied column, then order
        cand = scores >= kth
        rows, cols = np.nonzero(cand)
        counts = cand.sum(axis=1)
        width = int(counts.max())
        pos = np.zeros((scores.shape[0], width), np.int64)
        fill = np.arange(len(cols)) - np.repeat(np.cumsum(counts) - counts, counts)
        pos[rows, fill] = cols
        valid = np.arange(width)[None, :] < counts[:, None]
        s = np.where(valid, np.take_along_axis(scores, pos, axis=1), -np.inf)
        i = np.where(valid, np.take_along_axis(ids, pos, axis=1), np.iinfo(np.int64).max)
    else:
        pos = np.broadcast_to(np.arange(scores.shape[1]), scores.shape)
        s, i = scores, ids
    order = np.lexsort((i, -s), axis=1)[:, :k]  # by score descending, then id ascending
    return np.take_along_axis(pos, order, axis=1)


def column_average_precision(scores: np.ndarray, y: np.ndarray) -> np.ndarray:
    """AP of each column of ``scores`` (n, m) against 0/1 ``y`` (n, m), vectorised; NaN for a column without a
    positive. Ties count as scikit-learn counts them: one precision per distinct score."""
    n, m = scores.shape
    if n == 0 or m == 0:
        return np.full(m, np.nan)
    order = np.argsort(-scores, axis=0, kind="stable")
    s = np.take_along_axis(scores, order, axis=0)
    t = np.take_along_axis(np.asarray(y, dtype=np.float64), order, axis=0)
    tp = np.cumsum(t, axis=0)
    last = np.ones((n, m), bool)  # the last row of each group of equal scores: a distinct threshold
    last[:-1] = s[:-1] != s[1:]
    tp_at = np.where(last, tp, 0.0)
    prev = np.zeros_like(tp_at)
    prev[1:] = np.maximum.accumulate(tp_at, axis=0)[:-1]  # tp at the previous distinct threshold (tp never decreases)
    rank = np.arange(1, n + 1, dtype=np.float64)[:, None]
    gain = np.where(last, (tp - prev) * (tp / rank), 0.0).sum(axis=0)
    total = tp[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, gain / total, np.nan)


def evaluate_label_blocks(
    block_scores: Callable[[slice], np.ndarray],
    y: sp.csr_matrix | np.ndarray,
    *,
    ks: tuple[int, ...] = (1, 3, 5),
    threshold: float = 0.5,
    block: int | None = None,
    row_shift: np.ndarray | None = None,
) -> dict[str, float]:
    """All metrics (percent, the keys of :func:`~secure_fed.metrics.evaluate_scores`) from label blocks.

    Args:
        block_scores: ``block_scores(slice(a, b))`` returns the ``(n, b − a)`` scores of labels a..b−1 for every
            test row; it is called twice per block (the second pass is O-AP's) and must return the same values.
        y: the ``(n, C)`` 0/1 test labels (CSR or dense).
        block: labels per block (default: :func:`label_block_size`).
        row_shift: ``(n,)`` values subtracted from each row's scores for the ranking metrics (P@k, nDCG@k, mAP,
            O-AP; ``evaluation.center_scores``: each row's mean over all labels); the threshold metrics read the
            scores as ``block_scores`` gives them.
    """
    y = sp.csc_matrix(y)  # column blocks
    n, C = y.shape
    block = block or label_block_size(n, C)
    kmax = max(ks)
    top_s = np.full((n, 0), -np.inf)
    top_i = np.zeros((n, 0), np.int64)
    aps: list[np.ndarray] = []
    tp = np.zeros(C)
    npred = np.zeros(C)
    ntrue = np.asarray(y.sum(axis=0), dtype=np.float64).ravel()
    pos_scores: list[np.ndarray] = []
    for a in range(0, C, block):
        sl = slice(a, min(C, a + block))
        raw = np.asarray(block_scores(sl))  # in its own precision: the whole-matrix metrics rank the same values
        s = raw if row_shift is None else raw - row_shift[:, None]
        if s.shape != (n, sl.stop - a):
            raise ValueError(f"block_scores({sl}) gave shape {s.shape}, expected {(n, sl.stop - a)}")
        yb = y[:, sl].toarray().astype(bool)
        # running top-k: the block's own top-k merged with the best so far
        ids = np.broadcast_to(np.arange(a, sl.stop), s.shape)
        pos = topk_order(s, ids, kmax)
        cand_s = np.concatenate([top_s, np.take_along_axis(s, pos, axis=1)], axis=1)
        cand_i = np.concatenate([top_i, a + pos], axis=1)
        keep = topk_order(cand_s, cand_i, kmax)
        top_s, top_i = np.take_along_axis(cand_s, keep, axis=1), np.take_along_axis(cand_i, keep, axis=1)
        has = yb.any(axis=0)
        if has.any():
            aps.append(column_average_precision(s[:, has], yb[:, has]))
        pred = raw >= threshold
        npred[sl] = pred.sum(axis=0)
        tp[sl] = (pred & yb).sum(axis=0)
        pos_scores.append(s[yb])
    out: dict[str, float] = {}
    gains = _gains(y, top_i)
    for k in ks:
        kk = min(k, C)
        out[f"P@{k}"] = 100 * float(gains[:, :kk].sum(axis=1).mean() / k)
    for k in ks:
        out[f"nDCG@{k}"] = 100 * _ndcg(gains, np.asarray(y.sum(axis=1)).ravel(), k)
    ap = np.concatenate(aps) if aps else np.zeros(0)
    out["mAP"] = 100 * float(np.mean(ap)) if len(ap) else float("nan")
    positives = np.concatenate(pos_scores) if pos_scores else np.zeros(0)
    ranked = block_scores if row_shift is None else (lambda sl: np.asarray(block_scores(sl)) - row_shift[:, None])
    out["O-AP"] = 100 * _micro_ap(ranked, positives, y, n, C, block)
    out.update({key: 100 * v for key, v in threshold_from_counts(tp, npred, ntrue).items()})
    return out


def _gains(y: sp.csc_matrix, top_i: np.ndarray) -> np.ndarray:
    """(n, k) 0/1: whether each row's ranked label is one of its labels."""
    yr = sp.csr_matrix(y)
    yr.sort_indices()
    n, k = top_i.shape
    g = np.zeros((n, k))
    for j in range(k):  # k is small (the largest cut-off); each column a vectorised membership lookup
        g[:, j] = np.asarray(yr[np.arange(n), top_i[:, j]]).ravel() != 0
    return g


def _ndcg(gains: np.ndarray, npos: np.ndarray, k: int) -> float:
    kk = min(k, gains.shape[1])
    disc = 1.0 / np.log2(np.arange(2, kk + 2))
    dcg = (gains[:, :kk] * disc).sum(axis=1)
    idcg = np.concatenate([[0.0], np.cumsum(disc)])[np.minimum(npos, kk).astype(int)]
    ok = idcg > 0
    return float((dcg[ok] / idcg[ok]).mean()) if ok.any() else float("nan")


def _micro_ap(block_scores, pos: np.ndarray, y: sp.csc_matrix, n: int, C: int, block: int) -> float:
    """O-AP: Σ over distinct positive scores t of (positives at t / P) · (positives ≥ t / all scores ≥ t).

    The thresholds t come from the first pass's positive scores; every count (positives and all scores at or above
    each t) comes from this second pass's scores, so the precision is a ratio of counts of one set of values (≤ 1)
    even if a device's second pass differed in the last bits."""
    if len(pos) == 0:
        return float("nan")
    T = np.unique(pos)  # ascending distinct positive scores
    counts = np.zeros(len(T) + 1, np.int64)  # counts[j]: scores s with exactly j values of T ≤ s
    pos_counts = np.zeros(len(T) + 1, np.int64)  # ... of them positives
    for a in range(0, C, block):
        sl = slice(a, min(C, a + block))
        s = np.asarray(block_scores(sl))
        counts += np.bincount(np.searchsorted(T, s.ravel(), side="right"), minlength=len(T) + 1)
        p = s[y[:, sl].toarray().astype(bool)]
        pos_counts += np.bincount(np.searchsorted(T, p, side="right"), minlength=len(T) + 1)
    all_ge = np.cumsum(counts[::-1])[::-1][1:]  # scores ≥ T[j]: those with more than j values of T at or below
    pos_ge = np.cumsum(pos_counts[::-1])[::-1][1:]
    at_t = pos_counts[1:]  # positives in [T[j], T[j+1]): at T[j] when the passes agree
    P = pos_counts.sum()
    ok = all_ge > 0
    return float(np.sum(at_t[ok] / P * pos_ge[ok] / all_ge[ok]))
