"""The in-memory multi-label dataset every reader returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import scipy.sparse as sp


@dataclass(frozen=True)
class MultiLabelSplit:
    """One split of a multi-label dataset.

    Attributes:
        features: CSR matrix of shape ``(n, D)``, float32.
        labels: CSR matrix of shape ``(n, L)`` with 0/1 entries (int8).
    """

    features: sp.csr_matrix
    labels: sp.csr_matrix

    def __post_init__(self) -> None:
        if self.features.shape[0] != self.labels.shape[0]:
            raise ValueError(f"features have {self.features.shape[0]} rows but labels have {self.labels.shape[0]}")

    @property
    def num_instances(self) -> int:
        return int(self.features.shape[0])


@dataclass(frozen=True)
class MultiLabelDataset:
    """A train/test pair with label names.

    ``feature_kind`` is ``"sparse"`` for bag-of-words style inputs (the
    paper's text network applies) and ``"dense"`` for numeric features (MLP).
    """

    name: str
    train: MultiLabelSplit
    test: MultiLabelSplit
    label_names: list[str]
    feature_kind: str = "dense"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.train.features.shape[1] != self.test.features.shape[1]:
            raise ValueError("train and test have different feature dimensions")
        if self.train.labels.shape[1] != len(self.label_names):
            raise ValueError("label matrix width does not match the number of label names")

    @property
    def num_features(self) -> int:
        return int(self.train.features.shape[1])

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

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
        card = float(self.train.labels.sum(axis=1).mean())
        return (
            f"{self.name}: {self.train.num_instances} train / {self.test.num_instances} test, "
            f"{self.num_features} features, {self.num_labels} labels, "
            f"{card:.2f} labels per instance"
        )
