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

from secure_fed.models.group_updates import DeferredDelta


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

    def row_sq_norms(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """(n,) ‖a_i‖² of each row (in ``dtype``, default the values' own)."""
        v = self.values if dtype is None else self.values.to(dtype)
        out = torch.zeros(len(self), dtype=v.dtype, device=self.device)
        return out.index_add_(0, self.row_ids(), v * v)

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


class _Bag(torch.autograd.Function):
    """``x Wᵀ`` for sparse rows x: forward by ``embedding_bag`` over Wᵀ; backward into W's gradient only at the
    columns the batch touches: a dense gradient, or, when the layer has :attr:`SparseInputLinear.fused_sgd_lr`,
    no gradient at all but the SGD step itself on those columns (see that attribute)."""

    @staticmethod
    def forward(ctx, weight, indices, offsets, values, row_ids, fused_lr):
        ctx.save_for_backward(indices, values, row_ids)
        ctx.weight_shape, ctx.fused_lr = weight.shape, fused_lr
        ctx.weight = weight if fused_lr is not None else None  # stepped in place in backward, not saved for it
        return F.embedding_bag(indices, weight.t(), offsets, mode="sum", per_sample_weights=values)

    @staticmethod
    def backward(ctx, g):
        indices, values, row_ids = ctx.saved_tensors
        e, d = ctx.weight_shape
        cols, inverse = torch.unique(indices, return_inverse=True)
        part = torch.zeros(len(cols), e, dtype=g.dtype, device=g.device)
        part.index_add_(0, inverse, g[row_ids] * values.to(g.dtype).unsqueeze(1))  # (u, e): Σ_r v_rj g_r per column j
        if ctx.fused_lr is not None:  # w_j ← w_j − lr·g_j for the touched columns j: plain SGD's step, nothing else
            with torch.no_grad():
                ctx.weight.t().index_add_(0, cols, part.to(ctx.weight.dtype), alpha=-ctx.fused_lr)
            return None, None, None, None, None, None
        grad = torch.zeros(e, d, dtype=g.dtype, device=g.device)
        grad[:, cols] = part.T
        return grad, None, None, None, None, None


class SparseInputLinear(nn.Linear):
    """A linear layer that also reads :class:`SparseRows`: ``x Wᵀ (+ b)`` as an embedding bag over W's columns.

    The weight keeps ``nn.Linear``'s ``(out, in)`` shape, so θ, checkpoints, the vectorised executor (dense
    input) and DP-SGD's linear fast path see one kind of layer whatever the input. On sparse rows the forward is
    ``embedding_bag(indices, Wᵀ, offsets, mode="sum", per_sample_weights=values)``: row i's output is
    Σ_j v_ij W[:, j], the dense product without the zeros. With :func:`column_major` (the engine's choice for sparse
    rows) the weight is *stored* as its transpose, a ``(in, out)`` table, so the bag reads contiguous rows."""

    #: plain SGD on sparse rows (set by the trainer through :func:`set_fused_sgd`): the backward pass applies the
    #: step w_j ← w_j − lr·∂L/∂w_j to the batch's columns j itself and leaves ``weight.grad`` unset, as fused
    #: embedding optimisers do. The step is SGD's; it only skips forming a gradient of the whole table (an XC table
    #: has 203,882 columns, a batch touches ~2,000). The layer is the first in the network, so its backward runs
    #: after every other gradient is formed: the update is the one ``optimizer.step()`` would make.
    fused_sgd_lr: float | None = None

    def forward(self, x):  # type: ignore[override]
        if not isinstance(x, SparseRows):
            return super().forward(x)
        w = self.weight  # in its own precision under autocast too: a bf16 copy of the table would cost more than the bag
        lr = self.fused_sgd_lr if torch.is_grad_enabled() and w.requires_grad else None
        out = _Bag.apply(w, x.indices, x.offsets, x.values.to(w.dtype), x.row_ids(), lr)
        return out if self.bias is None else out + self.bias


def set_fused_sgd(model: nn.Module, lr: float | None) -> None:
    """Plain SGD with step ``lr`` fused into the backward pass on sparse rows (None: ordinary gradients) for every
    :class:`SparseInputLinear` of ``model``."""
    for m in model.modules():
        if isinstance(m, SparseInputLinear):
            m.fused_sgd_lr = lr


def column_major(model: nn.Module) -> nn.Module:
    """Store every :class:`SparseInputLinear` weight of ``model`` as its transpose (same values and shape, strides
    ``(1, out)``), so the embedding bag over sparse rows and the fused SGD step read and write contiguous
    ``out``-long rows of the table. Copies of θ made with ``clone``/``zeros_like`` keep the layout."""
    for m in model.modules():
        if isinstance(m, SparseInputLinear) and m.weight.stride() != (1, m.weight.shape[0]):
            m.weight.data = m.weight.data.t().contiguous().t()
    return model


@dataclass(frozen=True)
class RowSparseDelta:
    """A client's update of a :class:`SparseInputLinear` weight that is zero except at the input columns it touched.

    Under plain SGD on sparse rows a client changes only the table columns of the features its own rows hold
    (AmazonCat-13K: a few thousand of 203,882), so in a plaintext run its update travels as those columns:
    ``cols`` (k,) sorted, distinct, and ``values`` (k, out) with ``values[i] = Δ[:, cols[i]]``, for a weight of
    ``shape`` (out, in). The dense update is exactly :meth:`to_dense` (the other columns' deltas are exact zeros).
    The column set reveals which features the client's rows hold, so under secure aggregation or CKKS the update
    stays dense (those layers do not accept it, see ``LayerSpec.row_sparse_updates``)."""

    cols: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int]

    def add_to(self, target: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
        """``target += alpha·Δ`` in place at the touched columns only; returns ``target``."""
        if tuple(target.shape) != tuple(self.shape):
            raise ValueError(f"a row-sparse update of shape {self.shape} added to a tensor of shape {tuple(target.shape)}")
        target.t().index_add_(0, self.cols.to(target.device), self.values.to(target.device, target.dtype), alpha=alpha)
        return target

    def to_dense(self) -> torch.Tensor:
        """The dense (out, in) update (stored column-major, like the layer's weight)."""
        out = torch.zeros(self.shape[1], self.shape[0], dtype=self.values.dtype, device=self.values.device).t()
        out.t()[self.cols] = self.values
        return out


def dense_delta(t: torch.Tensor | RowSparseDelta | DeferredDelta) -> torch.Tensor:
    """An update as a dense tensor (a :class:`RowSparseDelta` expanded, a
    :class:`~secure_fed.models.group_updates.DeferredDelta` formed; a tensor as is)."""
    return t.to_dense() if isinstance(t, RowSparseDelta | DeferredDelta) else t


def apply_delta(t: torch.Tensor, d: torch.Tensor | RowSparseDelta | DeferredDelta) -> torch.Tensor:
    """``t + d`` as a new tensor, for a dense, row-sparse or deferred update ``d``."""
    return d.add_to(t.clone()) if isinstance(d, RowSparseDelta | DeferredDelta) else t + d
