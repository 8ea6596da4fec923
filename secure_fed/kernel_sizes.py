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
