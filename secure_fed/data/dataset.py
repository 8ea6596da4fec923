"""The in-memory multi-label dataset every reader returns."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

#: a split's features: a scipy CSR matrix (text, numeric data) or a dense array (images: uint8 pixels)
Features = sp.csr_matrix | np.ndarray

#: dtypes a dense feature array may have
DENSE_DTYPES = (np.dtype(np.float32), np.dtype(np.uint8))


def as_dense(x: Features, dtype=None) -> np.ndarray:
    """``x`` as a dense ``np.ndarray`` (a CSR matrix is expanded; a dense array is returned as is, not copied),
    cast to ``dtype`` when one is given."""
    arr = x.toarray() if sp.issparse(x) else np.asarray(x)
    return arr if dtype is None else arr.astype(dtype, copy=False)


def stack_rows(*parts: Features) -> Features:
    """The rows of ``parts`` one after the other: a CSR matrix when they are sparse, else a dense array (the
    parts are all of one kind, as the splits of one dataset are)."""
    if all(sp.issparse(p) for p in parts):
        return sp.vstack(parts).tocsr()
    if any(sp.issparse(p) for p in parts):
        raise ValueError("cannot stack sparse and dense feature rows")
    return np.concatenate(parts, axis=0)


def row_nnz(x: Features) -> np.ndarray:
    """The number of non-zero entries of each row of ``x`` (CSR or dense), as int64."""
    if sp.issparse(x):
        return np.diff(sp.csr_matrix(x).indptr).astype(np.int64)
    return np.count_nonzero(np.asarray(x), axis=1).astype(np.int64)


@dataclass(frozen=True)
class MultiLabelSplit:
    """One split of a multi-label dataset.

    Attributes:
        features: ``(n, D)``: a CSR matrix (float32), or a dense ``np.ndarray`` of float32 or uint8. Image datasets
            store each image flattened in channel-major order, ``(C*H*W,)`` uint8, with ``meta["image_shape"] =
            (C, H, W)`` on the dataset. Use :func:`as_dense` and :func:`row_nnz` to read either kind.
        labels: CSR matrix of shape ``(n, L)`` with 0/1 entries (int8).
    """

    features: Features
    labels: sp.csr_matrix

    def __post_init__(self) -> None:
        x = self.features
        if not sp.issparse(x):
            if not isinstance(x, np.ndarray) or x.ndim != 2:
                raise ValueError(f"features must be a CSR matrix or a 2-D np.ndarray, not {type(x).__name__}")
            if x.dtype not in DENSE_DTYPES:
                raise ValueError(f"dense features must be float32 or uint8, not {x.dtype}")
        if self.features.shape[0] != self.labels.shape[0]:
            raise ValueError(f"features have {self.features.shape[0]} rows but labels have {self.labels.shape[0]}")

    @property
    def is_dense(self) -> bool:
        """True when the features are a dense array (e.g. image pixels), False for a CSR matrix."""
        return not sp.issparse(self.features)

    @property
    def num_instances(self) -> int:
        """The number of rows (instances) of this split."""
        return int(self.features.shape[0])


@dataclass(frozen=True)
class MultiLabelDataset:
    """A train/test pair with label names.

    ``feature_kind`` is ``"sparse"`` for bag-of-words style inputs (the
    paper's text network applies), ``"dense"`` for numeric features (MLP) and
    ``"image"`` for images (ResNet backbones; ``meta["image_shape"]`` is ``(C, H, W)``).
    """

    name: str
    train: MultiLabelSplit
    test: MultiLabelSplit
    label_names: list[str]
    feature_kind: str = "dense"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """What the data must satisfy before anything trains on it: a :class:`DataError` (one line) otherwise."""
        from secure_fed.errors import DataError

        tr, te = self.train, self.test
        if tr.features.shape[1] != te.features.shape[1]:
            raise DataError(f"{self.name}: the training rows have {tr.features.shape[1]} features and the test rows "
                            f"{te.features.shape[1]}")  # fmt: skip
        if tr.labels.shape[1] != len(self.label_names) or te.labels.shape[1] != len(self.label_names):
            raise DataError(f"{self.name}: {len(self.label_names)} label names for label matrices of widths "
                            f"{tr.labels.shape[1]} (train) and {te.labels.shape[1]} (test)")  # fmt: skip
        if len(set(self.label_names)) != len(self.label_names):  # a set: O(C), at 670K labels too
            dup = sorted(n for n, c in Counter(self.label_names).items() if c > 1)
            raise DataError(f"{self.name}: label name {dup[0]!r} is listed twice")
        for split, part in (("training", tr), ("test", te)):
            if part.features.shape[0] == 0:
                raise DataError(f"{self.name}: the {split} split has no rows")
            if self.feature_kind != "image":
                values = part.features.data if sp.issparse(part.features) else part.features
                if values.dtype.kind == "f" and not np.isfinite(values).all():
                    raise DataError(f"{self.name}: the {split} features hold NaN or infinite values")

    @property
    def num_features(self) -> int:
        """D, the width of a feature row (for images C*H*W)."""
        return int(self.train.features.shape[1])

    @property
    def num_labels(self) -> int:
        """L, the number of labels."""
        return len(self.label_names)

    @property
    def image_shape(self) -> tuple[int, int, int] | None:
        """``(C, H, W)`` of an image dataset's rows, else None."""
        shape = self.meta.get("image_shape")
        return None if shape is None else tuple(int(v) for v in shape)

    def without_empty_labels(self) -> tuple[MultiLabelDataset, list[str]]:
        """The dataset without labels that no training instance has (train and test label spaces stay equal),
        and the names of the labels dropped. In the positive-only setting such a label has no client."""
        import numpy as np

        keep = np.flatnonzero(np.asarray(self.train.labels.sum(axis=0)).ravel() > 0)
        if len(keep) == self.num_labels:
            return self, []
        kept = set(keep.tolist())
        dropped = [n for i, n in enumerate(self.label_names) if i not in kept]
        ds = MultiLabelDataset(
            self.name,
            MultiLabelSplit(self.train.features, self.train.labels[:, keep].tocsr()),
            MultiLabelSplit(self.test.features, self.test.labels[:, keep].tocsr()),
            [self.label_names[i] for i in keep],
            self.feature_kind,
            {**self.meta, "dropped_labels": dropped},
        )
        return ds, dropped

    def describe(self) -> str:
        """One line: sizes, feature width (or image shape), labels and label cardinality."""
        card = float(self.train.labels.sum(axis=1).mean())
        shape = self.image_shape
        width = f"{'×'.join(map(str, shape))} images" if shape else f"{self.num_features} features"
        return (
            f"{self.name}: {self.train.num_instances} train / {self.test.num_instances} "
            f"{'validation (held-out training rows)' if 'evaluated_on' in self.meta else 'test'}, "
            f"{width}, {self.num_labels} labels, "
            f"{card:.2f} labels per instance"
        )
