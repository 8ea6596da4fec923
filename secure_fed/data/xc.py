"""Extreme Classification Repository format reader.

The format (http://manikvarma.org/downloads/XC/XMLRepository.html)::

    N D L                 <- header: instances, features, labels
    l1,l2 f:v f:v ...     <- one row per instance; labels are 0-based
     f:v f:v              <- a row with no label starts with its features

Some datasets ship one data file plus ``*_trSplit.txt`` / ``*_tstSplit.txt``
fold files: column j of each holds the 1-based row indices of fold j.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.errors import DataError


def read_xc(path: str | Path) -> MultiLabelSplit:
    """Read an XC-format file into CSR features (float32) and labels (int8).

    The rows are parsed by scikit-learn's svmlight reader (C code; ``multilabel=True``, 0-based features) from
    the line after the header, so a file of millions of rows loads at the speed of its size; memory is the CSR
    result plus the label tuples. A malformed file is then re-read line by line to name the first bad line."""
    from sklearn.datasets import load_svmlight_file

    path = Path(path)
    if not path.is_file():
        raise missing_file_error(path)
    with path.open("rb") as fh:
        n, d, n_labels = _header(path, fh.readline())
        try:
            features, label_tuples = load_svmlight_file(fh, n_features=d, multilabel=True, zero_based=True, dtype=np.float32)
        except ValueError as exc:
            _locate_error(path, d, n_labels)
            raise DataError(f"{path}: malformed rows ({exc})") from None
    lengths = np.fromiter(map(len, label_tuples), np.int64, count=len(label_tuples))
    cols = np.fromiter(itertools.chain.from_iterable(label_tuples), np.float64, count=int(lengths.sum()))
    if features.shape[0] != n:
        raise DataError(f"{path}: header says {n} rows but the file has {features.shape[0]}")
    if len(cols) and (cols.min() < 0 or cols.max() >= n_labels or np.any(cols != np.floor(cols))):
        _locate_error(path, d, n_labels)
        raise DataError(f"{path}: a label outside [0, {n_labels})")
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    labels = sp.csr_matrix((np.ones(len(cols), np.int8), cols.astype(np.int64), indptr), shape=(n, n_labels))
    features = sp.csr_matrix(features, dtype=np.float32)
    features.sum_duplicates()
    labels.sum_duplicates()
    labels.data[:] = 1
    return MultiLabelSplit(features=features, labels=labels)


def missing_file_error(path: str | Path) -> DataError:
    """The error for an XC data file that is not there, with the command that writes synthetic ones."""
    path = Path(path)
    return DataError(
        f"data file not found: {path} (no XC data at hand? `secure-fed data synth-xc --like eurlex-4k --out DIR` "
        "writes synthetic DIR/train.txt and DIR/test.txt)"
    )


def _header(path: Path, line: bytes) -> tuple[int, int, int]:
    header = line.decode("utf-8", "replace").split()
    try:
        if len(header) != 3:
            raise ValueError
        n, d, n_labels = (int(x) for x in header)
    except ValueError:
        raise DataError(f"{path}:1: expected header 'N D L', got {' '.join(header)!r}") from None
    return n, d, n_labels


def _locate_error(path: Path, d: int, n_labels: int) -> None:
    """Raise a :class:`DataError` naming the first malformed line of an XC file (the slow diagnostic pass)."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        fh.readline()
        for lineno, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            tokens = line.split()
            labels_tok, feats = ("", tokens) if ":" in tokens[0] else (tokens[0], tokens[1:])
            try:
                for lab in filter(None, labels_tok.split(",")):
                    if not 0 <= int(lab) < n_labels:
                        raise ValueError(f"label {lab} outside [0, {n_labels})")
                for tok in feats:
                    fi, fv = tok.split(":", 1)
                    float(fv)
                    if not 0 <= int(fi) < d:
                        raise ValueError(f"feature {fi} outside [0, {d})")
            except ValueError as exc:
                raise DataError(f"{path}:{lineno}: malformed row ({exc})") from None


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
