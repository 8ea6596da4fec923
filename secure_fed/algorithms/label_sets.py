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


def canonical_rows(x: sp.spmatrix | np.ndarray):
    """:func:`canonical_instance_bytes` of every row of ``x``, built for all rows at once with numpy (no per-row
    slicing): yields one ``memoryview`` per row, in order, each equal to that row's canonical encoding."""
    m = sp.csr_matrix(x, copy=True)  # in its own dtype until the values are written, as the per-row encoding does
    m.sum_duplicates()  # sorted, unique indices per row
    m.eliminate_zeros()
    n, dim = m.shape
    nnz = np.diff(m.indptr).astype(np.int64)
    lengths = 12 + 8 * nnz
    starts = np.concatenate([[0], np.cumsum(lengths)])[:n].astype(np.int64)  # n = 0 (a client with no rows): none
    buf = np.empty(int(lengths.sum()), np.uint8)
    head = np.empty((n, 3), "<u4")
    head[:, 0] = np.frombuffer(b"SFI1", "<u4")[0]
    head[:, 1] = dim
    head[:, 2] = nnz
    take = (starts[:, None] + np.arange(12)).ravel()
    buf[take] = head.view(np.uint8).ravel()
    # each stored value's byte positions: its row's start + 12, then 4 bytes per index before it in the row
    pos_in_row = np.arange(m.nnz, dtype=np.int64) - np.repeat(m.indptr[:-1].astype(np.int64), nnz)
    idx_at = np.repeat(starts + 12, nnz) + 4 * pos_in_row
    val_at = idx_at + 4 * np.repeat(nnz, nnz)
    four = np.arange(4)
    buf[(idx_at[:, None] + four).ravel()] = m.indices.astype("<u4").view(np.uint8)
    buf[(val_at[:, None] + four).ravel()] = m.data.astype("<f4").view(np.uint8)
    view = memoryview(buf)
    for s, length in zip(starts.tolist(), lengths.tolist(), strict=True):
        yield view[s : s + length]


class Tokenizer(ABC):
    """Maps each instance a client holds to a fixed-size token (bytes)."""

    name: str = ""

    @abstractmethod
    def tokens(self, raw_features: sp.csr_matrix) -> list[bytes]: ...


class Sha256Tokenizer(Tokenizer):
    """The paper's tokenizer: SHA-256 of :func:`canonical_instance_bytes` (32 bytes)."""

    name = "sha256"

    def tokens(self, raw_features: sp.csr_matrix) -> list[bytes]:
        return [hashlib.sha256(row).digest() for row in canonical_rows(raw_features)]


TOKENIZERS: dict[str, type[Tokenizer]] = {Sha256Tokenizer.name: Sha256Tokenizer}


def merge_label_sets(messages: list[tuple[list[bytes], int]], num_labels: int) -> sp.csr_matrix:
    """Server side: merge (tokens, label) messages into an ``(n_all, C)`` sparse 0/1 matrix (CSR, float32).

    One row per distinct token, in first-seen order. Identical instances share a
    token and therefore a row, exactly as in the paper's protocol. Memory is O(tokens), never O(n_all·C).
    """
    row_of: dict[bytes, int] = {}
    rows: list[int] = []
    cols: list[np.ndarray] = []
    for tokens, label in messages:
        rows.extend(row_of.setdefault(t, len(row_of)) for t in tokens)
        cols.append(np.full(len(tokens), label, np.int64))
    r = np.asarray(rows, np.int64)
    c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    Y = sp.csr_matrix((np.ones(len(r), np.float32), (r, c)), shape=(len(row_of), num_labels))
    Y.sum_duplicates()
    Y.data[:] = 1.0  # a client sending one token twice (duplicate rows) still marks one label
    return Y
