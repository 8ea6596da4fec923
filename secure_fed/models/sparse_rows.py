"""Sparse feature rows on the compute device: a CSR batch the text network's first layer reads as an embedding bag.

Extreme-classification features are very sparse (AmazonCat-13K: 203,882 features, ~71 non-zeros a row), so a
dense ``(n, D)`` copy of a client's rows, let alone of the training split, does not fit. :class:`SparseRows`
keeps a client's preprocessed rows in CSR form (``indptr``, ``indices``, ``values`` as torch tensors) and gives
the few operations training and evaluation need: row selection by an index tensor (a batch), ``len``, ``shape``,
``device``, moving between devices, and the two products the DP-SGD linear fast path needs (squared row norms,
and ``Gᵀ A`` for an output gradient ``G``), each O(nnz), never O(n·D).

The network's first layer (:class:`SparseInputLinear`) computes ``x Wᵀ`` from these rows with
``torch.nn.functional.embedding_bag`` (mode ``sum``, the values as per-sample weights): the FedAwS paper's
"embedding lookup followed by averaging", the same function as a bias-free linear layer on the dense rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class SparseRows:
    """``n`` rows of a ``(n, D)`` sparse matrix in CSR form: ``indptr`` (n + 1,), ``indices`` and ``values`` (nnz,)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    num_features: int

    @classmethod
    def from_csr(cls, m: sp.spmatrix, *, device: torch.device | str = "cpu", dtype=torch.float32) -> SparseRows:
        """Rows of a scipy sparse matrix (duplicates summed; the values cast to ``dtype``)."""
        m = sp.csr_matrix(m)
        m.sum_duplicates()
        return cls(
            torch.from_numpy(m.indptr.astype(np.int64)).to(device),
            torch.from_numpy(m.indices.astype(np.int64)).to(device),
            torch.from_numpy(np.asarray(m.data)).to(device=device, dtype=dtype),
            int(m.shape[1]),
        )

    # ---------------------------------------------------------------- tensor-like surface
    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.indptr.shape[0]) - 1, self.num_features)

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def offsets(self) -> torch.Tensor:
        """Each row's first position in ``indices`` (``embedding_bag``'s ``offsets``)."""
        return self.indptr[:-1]

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def __len__(self) -> int:
        return self.shape[0]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> SparseRows:
        return SparseRows(
            self.indptr.to(device), self.indices.to(device), self.values.to(device=device, dtype=dtype), self.num_features
        )

    def cpu(self) -> SparseRows:
        return self.to("cpu")

    def detach(self) -> SparseRows:
        return self

    def __getitem__(self, idx) -> SparseRows:
        """The rows ``idx`` (an index tensor or array, a slice, or an int list), in that order."""
        n = len(self)
        if isinstance(idx, slice):
            idx = torch.arange(n, device=self.indptr.device)[idx]
        idx = torch.as_tensor(idx, dtype=torch.int64, device=self.indptr.device).reshape(-1)
        if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"row index out of range for {n} rows")
        idx = torch.where(idx < 0, idx + n, idx)
        starts = self.indptr[idx]
        lengths = self.indptr[idx + 1] - starts
        indptr = torch.zeros(idx.numel() + 1, dtype=torch.int64, device=idx.device)
        torch.cumsum(lengths, 0, out=indptr[1:])
        total = int(indptr[-1])
        # position p of the output row r reads input position starts[r] + (p − indptr[r])
        pos = torch.repeat_interleave(starts - indptr[:-1], lengths, output_size=total) + torch.arange(total, device=idx.device)
        return SparseRows(indptr, self.indices[pos], self.values[pos], self.num_features)

    def to_dense(self) -> torch.Tensor:
        """The ``(n, D)`` dense matrix (tests and small data only)."""
        out = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        out[self.row_ids(), self.indices] = self.values
        return out

    # ---------------------------------------------------------------- products for DP-SGD's linear fast path
    def row_ids(self) -> torch.Tensor:
        """(nnz,) the row of each stored value."""
        n = len(self)
        lengths = self.indptr[1:] - self.indptr[:-1]
        return torch.repeat_interleave(torch.arange(n, device=self.device), lengths, output_size=self.nnz)

    def row_sq_norms(self) -> torch.Tensor:
        """(n,) ‖a_i‖² of each row."""
        out = torch.zeros(len(self), dtype=self.values.dtype, device=self.device)
        return out.index_add_(0, self.row_ids(), self.values * self.values)

    def t_matmul(self, g: torch.Tensor) -> torch.Tensor:
        """``gᵀ A`` for ``g`` (n, e): an (e, D) matrix, the gradient of a bias-free linear layer's weight."""
        out = torch.zeros(self.num_features, g.shape[1], dtype=g.dtype, device=g.device)
        out.index_add_(0, self.indices, g[self.row_ids()] * self.values.to(g.dtype).unsqueeze(1))
        return out.T


def split_rows(x: torch.Tensor | SparseRows, size: int) -> list[torch.Tensor | SparseRows]:
    """``torch.split`` along rows for dense tensors and :class:`SparseRows` alike."""
    if isinstance(x, SparseRows):
        return [x[s : s + size] for s in range(0, len(x), size)]
    return list(torch.split(x, size))


#: a sparse gradient only when the batch touches under 1/N of the columns (else the dense add is cheaper)
SPARSE_GRAD_MAX_SHARE = 8


class _Bag(torch.autograd.Function):
    """``x Wᵀ`` for sparse rows x: forward by ``embedding_bag`` over Wᵀ; backward into W's gradient only at the
    columns the batch touches, as a sparse COO tensor (``sparse=True`` and under 1/8 of the columns touched) or a
    dense one."""

    @staticmethod
    def forward(ctx, weight, indices, offsets, values, row_ids, sparse):
        ctx.save_for_backward(indices, values, row_ids)
        ctx.weight_shape, ctx.sparse = weight.shape, sparse
        return F.embedding_bag(indices, weight.t(), offsets, mode="sum", per_sample_weights=values)

    @staticmethod
    def backward(ctx, g):
        indices, values, row_ids = ctx.saved_tensors
        e, d = ctx.weight_shape
        cols, inverse = torch.unique(indices, return_inverse=True)  # sorted: the COO tensor below is coalesced
        part = torch.zeros(len(cols), e, dtype=g.dtype, device=g.device)
        part.index_add_(0, inverse, g[row_ids] * values.to(g.dtype).unsqueeze(1))  # (u, e): Σ_r v_rj g_r per column j
        if ctx.sparse and len(cols) * SPARSE_GRAD_MAX_SHARE < d:
            u = len(cols)
            idx = torch.stack((torch.arange(e, device=g.device).repeat_interleave(u), cols.repeat(e)))
            grad = torch.sparse_coo_tensor(
                idx, part.T.reshape(-1), (e, d), is_coalesced=True, check_invariants=False
            )  # built sorted and unique above
        else:
            grad = torch.zeros(e, d, dtype=g.dtype, device=g.device)
            grad[:, cols] = part.T
        return grad, None, None, None, None, None


class SparseInputLinear(nn.Linear):
    """A linear layer that also reads :class:`SparseRows`: ``x Wᵀ (+ b)`` as an embedding bag over W's columns.

    The weight keeps ``nn.Linear``'s ``(out, in)`` layout, so θ, checkpoints, the vectorised executor (dense
    input) and DP-SGD's linear fast path see one kind of layer whatever the input. On sparse rows the forward is
    ``embedding_bag(indices, Wᵀ, offsets, mode="sum", per_sample_weights=values)``: row i's output is
    Σ_j v_ij W[:, j], the dense product without the zeros. The weight's gradient touches only the batch's columns;
    with :attr:`sparse_grad` it is a sparse tensor (plain SGD steps on those columns only: an XC table of 203,882
    columns is not rewritten at every step), else a dense one (any optimiser)."""

    #: sparse rows give the weight a sparse gradient (set by the trainer for plain SGD, which applies it as is)
    sparse_grad: bool = False

    def forward(self, x):  # type: ignore[override]
        if not isinstance(x, SparseRows):
            return super().forward(x)
        w = self.weight  # in its own precision under autocast too: a bf16 copy of the table would cost more than the bag
        out = _Bag.apply(w, x.indices, x.offsets, x.values.to(w.dtype), x.row_ids(), self.sparse_grad)
        return out if self.bias is None else out + self.bias


def set_sparse_grads(model: nn.Module, enabled: bool) -> None:
    """Sparse weight gradients on (or off) for every :class:`SparseInputLinear` of ``model``."""
    for m in model.modules():
        if isinstance(m, SparseInputLinear):
            m.sparse_grad = enabled
