"""Extreme Classification Repository format reader.

The format (http://manikvarma.org/downloads/XC/XMLRepository.html)::

    N D L                 <- header: instances, features, labels
    l1,l2 f:v f:v ...     <- one row per instance; labels are 0-based
     f:v f:v              <- a row with no label starts with its features

Some datasets ship one data file plus ``*_trSplit.txt`` / ``*_tstSplit.txt``
fold files: column j of each holds the 1-based row indices of fold j.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.errors import DataError


def read_xc(path: str | Path) -> MultiLabelSplit:
    """Read an XC-format file into CSR features and labels."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file not found: {path}")
    with path.open("r", encoding="utf-8") as fh:
        header = fh.readline().split()
        if len(header) != 3:
            raise DataError(f"{path}:1: expected header 'N D L', got {' '.join(header)!r}")
        n, d, n_labels = (int(x) for x in header)
        f_rows, f_cols, f_vals, l_rows, l_cols = [], [], [], [], []
        row = 0
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            tokens = line.split()
            if ":" not in tokens[0]:
                labels_tok, feats = tokens[0], tokens[1:]
            else:
                labels_tok, feats = "", tokens
            try:
                for lab in filter(None, labels_tok.split(",")):
                    li = int(lab)
                    if not 0 <= li < n_labels:
                        raise ValueError(f"label {li} outside [0, {n_labels})")
                    l_rows.append(row)
                    l_cols.append(li)
                for tok in feats:
                    fi, fv = tok.split(":", 1)
                    fi = int(fi)
                    if not 0 <= fi < d:
                        raise ValueError(f"feature {fi} outside [0, {d})")
                    f_rows.append(row)
                    f_cols.append(fi)
                    f_vals.append(float(fv))
            except ValueError as exc:
                raise DataError(f"{path}:{lineno}: malformed row ({exc})") from None
            row += 1
    if row != n:
        raise DataError(f"{path}: header says {n} rows but the file has {row}")
    features = sp.csr_matrix((np.asarray(f_vals, np.float32), (f_rows, f_cols)), shape=(n, d))
    labels = sp.csr_matrix((np.ones(len(l_rows), np.int8), (l_rows, l_cols)), shape=(n, n_labels))
    features.sum_duplicates()
    labels.sum_duplicates()
    labels.data[:] = 1
    return MultiLabelSplit(features=features, labels=labels)


def read_xc_split(
    data_path: str | Path, train_split: str | Path, test_split: str | Path, *, fold: int = 0
) -> tuple[MultiLabelSplit, MultiLabelSplit]:
    """Read a single XC data file and cut it with ``*_trSplit``/``*_tstSplit`` fold files."""
    return cut_by_fold_files(read_xc(data_path), train_split, test_split, fold=fold, source=data_path)


def cut_by_fold_files(
    full: MultiLabelSplit, train_split: str | Path, test_split: str | Path, *, fold: int, source: str | Path
) -> tuple[MultiLabelSplit, MultiLabelSplit]:
    """Cut one file's rows with fold files (one column per fold, 1-based row numbers; the XC and Mulan convention)."""

    def rows(p: str | Path) -> np.ndarray:
        p = Path(p)
        if not p.is_file():
            raise DataError(f"split file not found: {p}")
        table = np.atleast_2d(np.loadtxt(p, dtype=np.int64, ndmin=2))
        if not 0 <= fold < table.shape[1]:
            raise DataError(f"{p}: fold {fold} requested but the file has {table.shape[1]} folds")
        idx = table[:, fold] - 1
        if idx.min() < 0 or idx.max() >= full.num_instances:
            raise DataError(f"{p}: row index out of range for {source}")
        return idx

    tr, te = rows(train_split), rows(test_split)
    take = lambda idx: MultiLabelSplit(full.features[idx], full.labels[idx])  # noqa: E731
    return take(tr), take(te)


def seeded_split(full: MultiLabelSplit, *, test_fraction: float, seed: int) -> tuple[MultiLabelSplit, MultiLabelSplit]:
    """A data set shipped as one file: a seeded random ``test_fraction`` of its rows is the test split."""
    n = full.num_instances
    n_test = int(round(n * test_fraction))
    if not 0 < n_test < n:
        raise DataError(f"dataset.test_fraction={test_fraction} leaves no training or no test rows of {n}")
    order = np.random.default_rng(seed).permutation(n)
    te, tr = np.sort(order[:n_test]), np.sort(order[n_test:])
    return MultiLabelSplit(full.features[tr], full.labels[tr]), MultiLabelSplit(full.features[te], full.labels[te])
