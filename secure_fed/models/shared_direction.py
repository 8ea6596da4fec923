"""The class rows without their shared direction (``evaluation.remove_shared_direction``).

Every class row of a positive-only model shares one direction: the rows are class centroids of embeddings that
share a common component (for nonnegative inputs, their mean), so each cosine score carries a term that depends on
the label alone and favours the labels whose rows hold most of it. Under DP noise the rows of frequent labels keep
more of it than the rows of rare labels (mostly noise, nearly orthogonal to it), so the term acts as a label prior
that P@1 rewards only in part. Removing from every row its component along the rows' top right singular vector
(then scoring with the renormalised rows) removes that term. It reads the released W alone: a post-processing, with
no privacy cost and no setting. It is the first step of "all-but-the-top" (Mu & Viswanath, ICLR 2018), which removes
the common mean and top directions of word embeddings; here the rows are not centred first, and only the top
direction goes.
"""

from __future__ import annotations

import torch

#: rows per block of the float64 Gram matrix WᵀW (an extreme-classification W is never copied whole in float64)
GRAM_BLOCK_ROWS = 65536


def shared_direction(rows: torch.Tensor) -> torch.Tensor:
    """The unit vector the rows share most: the top right singular vector of the (C, d) rows, as the eigenvector of
    the largest eigenvalue of the d × d Gram matrix WᵀW (formed in float64, a block of rows at a time). Float64, on
    the CPU; its sign is irrelevant to :func:`remove_shared_direction`."""
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"shared_direction needs a (C, d) matrix of rows with C ≥ 1, not shape {tuple(rows.shape)}")
    d = rows.shape[1]
    gram = torch.zeros(d, d, dtype=torch.float64, device=rows.device)
    for a in range(0, rows.shape[0], GRAM_BLOCK_ROWS):
        block = rows[a : a + GRAM_BLOCK_ROWS].detach().double()
        gram += block.T @ block
    _, vecs = torch.linalg.eigh(gram)
    return vecs[:, -1].cpu()


def remove_shared_direction(rows: torch.Tensor) -> torch.Tensor:
    """Each row minus its component along :func:`shared_direction`, in ``rows``' dtype and on its device. The rows are
    not renormalised here: the cosine family normalises them when it scores (a row left with no component scores 0)."""
    v = shared_direction(rows).to(device=rows.device)
    r = rows.detach()
    if r.dtype == torch.float64:
        return r - torch.outer(r @ v, v)
    vv = v.to(r.dtype)
    return r - torch.outer(r @ vv, vv)
