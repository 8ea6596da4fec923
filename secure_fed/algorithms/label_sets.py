"""Label-set collection for FedALC (FedALC §IV-E, Algorithm 1 lines 4–10).

Each client turns every instance it holds into a *token* and sends the tokens
with its label. The server merges equal tokens into label sets: an instance
held by clients u and u' (it has both labels) yields the set {u, u'}. The
server never sees features.

The tokenizer is pluggable. :class:`Sha256Tokenizer` is the paper's plain
SHA-256 over a canonical byte encoding of the instance. It is unkeyed: anyone
who holds a candidate instance can recompute its token (see ``threat_models``);
a keyed tokenizer is a protocol layer.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod

import numpy as np
import scipy.sparse as sp
import torch


def canonical_instance_bytes(row: sp.csr_matrix | np.ndarray) -> bytes:
    """A platform-independent encoding of one feature vector.

    ``b"SFI1" | D (uint32 LE) | nnz (uint32 LE) | sorted indices (uint32 LE) |
    values (float32 LE)``; dense and sparse inputs with the same values encode
    identically.
    """
    if sp.issparse(row):
        r = sp.csr_matrix(row)
        r.sum_duplicates()
        r.eliminate_zeros()
        idx, val, dim = r.indices, r.data, r.shape[1]
    else:
        arr = np.asarray(row).ravel()
        idx = np.flatnonzero(arr)
        val, dim = arr[idx], arr.shape[0]
    order = np.argsort(idx, kind="stable")
    return b"".join(
        (
            b"SFI1",
            np.uint32(dim).tobytes(),
            np.uint32(len(idx)).tobytes(),
            np.asarray(idx[order], dtype="<u4").tobytes(),
            np.asarray(val[order], dtype="<f4").tobytes(),
        )
    )


class Tokenizer(ABC):
    """Maps each instance a client holds to a fixed-size token (bytes)."""

    name: str = ""

    @abstractmethod
    def tokens(self, raw_features: sp.csr_matrix) -> list[bytes]: ...


class Sha256Tokenizer(Tokenizer):
    """The paper's tokenizer: SHA-256 of :func:`canonical_instance_bytes` (32 bytes)."""

    name = "sha256"

    def tokens(self, raw_features: sp.csr_matrix) -> list[bytes]:
        x = sp.csr_matrix(raw_features)
        return [hashlib.sha256(canonical_instance_bytes(x[i])).digest() for i in range(x.shape[0])]


TOKENIZERS: dict[str, type[Tokenizer]] = {Sha256Tokenizer.name: Sha256Tokenizer}


def merge_label_sets(messages: list[tuple[list[bytes], int]], num_labels: int) -> torch.Tensor:
    """Server side: merge (tokens, label) messages into an ``(n_all, C)`` 0/1 matrix.

    One row per distinct token, in first-seen order. Identical instances share a
    token and therefore a row, exactly as in the paper's protocol.
    """
    row_of: dict[bytes, int] = {}
    rows, cols = [], []
    for tokens, label in messages:
        for t in tokens:
            r = row_of.setdefault(t, len(row_of))
            rows.append(r)
            cols.append(label)
    Y = torch.zeros((len(row_of), num_labels), dtype=torch.float32)
    if rows:
        Y[torch.tensor(rows), torch.tensor(cols)] = 1.0
    return Y
