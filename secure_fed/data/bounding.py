"""Contribution bounding: at most m clients per training instance, by a rule of that instance alone.

In the positive-only partition an instance sits on one client per label, so the number of client trainings it
can enter in a round is its label count. A DP unit that counts those trainings (DP-SGD in client training; the
client unit's translation to instances) must count them from a **public** bound m (config:
``privacy.*.max_labels_per_instance``), never from the data's largest label count: that count is a function of
one instance (on Bibtex, 28 labels are held by a single instance), so a σ or a step count computed from it would
release that instance's membership and make the noise level itself data-dependent.

An instance with more than m labels is bounded before the partition, by a rule that reads that instance only:

* ``keep_hashed``: it keeps the m labels l with the smallest ``SHA-256(key ‖ digest(instance) ‖ l)``, where the
  digest hashes its feature row and label set; it enters those m clients only;
* ``drop``: it enters no client.

Adding or removing any other instance changes nothing about this instance's clients, and nothing released about
the run (σ, steps, scope, group sizes follow from m). The key is derived from the run's seed: the rule needs to be
a function of the instance, not a secret. How many instances were bounded is a statistic of private data: it goes
to the run's private diagnostics only.
"""

from __future__ import annotations

import hashlib

import numpy as np
import scipy.sparse as sp

#: the rules an instance above the bound follows
RULES = ("keep_hashed", "drop")


def bounding_key(seed: int) -> bytes:
    """The hash key of a run with ``seed`` (public: the rule is a function of the instance, not a secret)."""
    return hashlib.sha256(b"secure-fed contribution bounding " + int(seed).to_bytes(8, "little", signed=False)).digest()


def _instance_digest(features, row: int, labels: np.ndarray) -> bytes:
    """SHA-256 of one instance: its feature row (values and columns of a CSR row, or a dense row's bytes) and labels."""
    h = hashlib.sha256()
    if sp.issparse(features):  # canonical: duplicates summed, explicit zeros dropped, columns sorted
        x = sp.csr_matrix(features[row], dtype=np.float64, copy=True)
        x.sum_duplicates()
        x.eliminate_zeros()
        x.sort_indices()
        h.update(np.asarray(x.indices, dtype=np.int64).tobytes())
        h.update(np.asarray(x.data, dtype=np.float64).tobytes())
    else:
        h.update(np.ascontiguousarray(np.asarray(features[row], dtype=np.float64)).tobytes())
    h.update(b"|labels|")
    h.update(np.sort(labels).astype(np.int64).tobytes())
    return h.digest()


def kept_labels(features, row: int, labels: np.ndarray, m: int, key: bytes) -> np.ndarray:
    """The ``m`` labels of an instance with labels ``labels`` that ``keep_hashed`` keeps (sorted)."""
    digest = _instance_digest(features, row, labels)
    scores = [hashlib.sha256(key + digest + int(lab).to_bytes(8, "little")).digest() for lab in labels]
    order = sorted(range(len(labels)), key=lambda i: scores[i])
    return np.sort(np.asarray(labels)[order[:m]])


def bound_labels(labels: sp.csr_matrix, features, m: int, rule: str, key: bytes) -> tuple[sp.csr_matrix, int]:
    """``labels`` with every row of more than ``m`` labels bounded by ``rule``; and how many rows were bounded.

    ``features`` are the split's feature rows (the digest reads the bounded rows only). Rows within the bound are
    unchanged; the result is a new CSR matrix of the same shape (0/1, int8)."""
    if m < 1:
        raise ValueError(f"a contribution bound is at least 1, not {m}")
    if rule not in RULES:
        raise ValueError(f"unknown bounding rule {rule!r}; choose one of {RULES}")
    y = sp.csr_matrix(labels, copy=True)
    y.eliminate_zeros()
    y.sort_indices()
    counts = np.diff(y.indptr)
    over = np.flatnonzero(counts > m)
    if len(over) == 0:
        return y, 0
    rows, cols = [], []
    keep_rows = np.ones(y.shape[0], dtype=bool)
    keep_rows[over] = False
    coo = y.tocoo()
    mask = keep_rows[coo.row]
    rows.append(coo.row[mask])
    cols.append(coo.col[mask])
    if rule == "keep_hashed":
        for r in over:
            own = y.indices[y.indptr[r] : y.indptr[r + 1]]
            kept = kept_labels(features, int(r), own, m, key)
            rows.append(np.full(len(kept), r, dtype=coo.row.dtype))
            cols.append(kept.astype(coo.col.dtype))
    r_all, c_all = np.concatenate(rows), np.concatenate(cols)
    out = sp.csr_matrix((np.ones(len(r_all), dtype=np.int8), (r_all, c_all)), shape=y.shape)
    out.sort_indices()
    return out, int(len(over))


__all__ = ["RULES", "bound_labels", "bounding_key", "kept_labels"]
