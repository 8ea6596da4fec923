"""The block and chunk sizes of the compute kernels, and the NN-descent search's parameters.

The kernels that use them (:mod:`secure_fed.algorithms.regularizers`, :mod:`protocols.dp.label_set_dpsgd`) and the
memory estimate that sizes their blocks (:mod:`secure_fed.memory`) both import them from here, so the estimate needs
no kernel module and no kernel module needs the estimate. This module imports nothing: ``secure-fed validate`` reads
it without importing torch (``secure_fed.algorithms``, whose package imports every algorithm, would import torch).
"""

from __future__ import annotations

#: elements (pairs × d) of one block of a top-k regulariser's pair tensors
#: (:func:`secure_fed.algorithms.regularizers.outer_blocks`)
PAIR_BLOCK_ELEMENTS = 2**24
#: elements of the (rows × C) block of eq. 12's all-pairs term and of the exact neighbour search
#: (:data:`secure_fed.algorithms.regularizers.NEIGHBOUR_BLOCK_ELEMENTS`)
ROW_BLOCK_ELEMENTS = 2**24
#: FedALC's NN-descent search (``ann_index: nndescent``, ``approximate_nearest_classes`` in
#: ``secure_fed/algorithms/regularizers.py``): graph degree (at least k + 1), neighbours sampled a row and iteration
#: (S), reverse neighbours kept (R), pool beyond the degree (L − degree), iterations. On 50,000 clustered rows
#: (d = 512, K = 50) S = 10 found 0.908 of the exact neighbours, S = 14 0.967 (40.7 s on one core), S = 20 0.991 (60.1 s)
NNDESCENT = {"degree": 64, "samples": 14, "reverse": 100, "pool_extra": 16, "iterations": 10}
#: elements of one chunk's per-set gradients (chunk × C × d) a DP step on W holds at once (fp32: 256 MB); the
#: per-set tensors of a chunk (its gradients, eq. 12's per-set pair terms) are a few of these
#: (:func:`protocols.dp.label_set_dpsgd.dp_label_set_step`)
PER_SET_CHUNK_ELEMENTS = 2**26

# What the kernels hold per element, the memory estimate's factors (:mod:`secure_fed.memory`; each algorithm's and
# layer's own terms, :meth:`secure_fed.algorithms.params.base.AlgorithmParams.memory_terms` and ``LayerSpec.memory``)

#: bytes per instance copy while label sets are collected (a 32-byte token object and its list slot, the merge map)
TOKEN_BYTES = 180
#: bytes per co-occurring label pair (the CSR product's float64 value and index, and its temporary)
COOCCURRENCE_BYTES = 24
#: float32 (pairs × d) tensors a block of the top-k regulariser's backward holds (gathered rows, products, grads)
PAIR_TENSORS = 6
#: FedALC-fixed (eq. 12): float32 (rows × C) blocks its step holds (cosines, hinge, weights, their product), and
#: C·d tables (unit rows, two gradients, the hinge row sums)
FIXED_BLOCKS = 4
FIXED_TABLES = 4
#: per-set tensors of one chunk a DP step on W holds (its gradients, eq. 12's per-set pair terms), each of
#: :data:`PER_SET_CHUNK_ELEMENTS` elements at most
PER_SET_TENSORS = 3


def top_k_pair_block_bytes(num_labels: int, k: int, dim: int) -> int:
    """Bytes of one block of the top-k regulariser's pair tensors (C·k pairs of d floats, in blocks)."""
    return min(num_labels * k * dim, PAIR_BLOCK_ELEMENTS) * 4 * PAIR_TENSORS


def per_set_chunk_bytes(num_labels: int, dim: int) -> int:
    """Bytes of the per-set tensors of one chunk of a DP step on W (:func:`protocols.dp.label_set_dpsgd.dp_label_set_step`)."""
    return 4 * PER_SET_TENSORS * max(min(PER_SET_CHUNK_ELEMENTS, 64 * num_labels * dim), num_labels * dim)
