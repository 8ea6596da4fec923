"""Synthetic multi-label data with controllable label co-occurrence.

Labels are split into ``num_groups`` groups of related labels. Each instance
draws a primary label (label frequencies follow a Zipf law with exponent
``zipf``), then adds each other label of the primary's group with probability
``cooccurrence`` and any label at all with probability ``noise_label_rate``.
Features are the mean of the instance's label centroids plus Gaussian noise;
labels of one group have correlated centroids (``group_similarity``), so
co-occurring labels are also close in feature space, as in real data.

With ``cooccurrence=0`` the data is (almost) single-label; raising it makes
label correlations, the signal FedALC exploits, stronger.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from secure_fed.data.dataset import MultiLabelDataset, MultiLabelSplit


@dataclass(frozen=True, kw_only=True)
class SyntheticSpec:
    num_train: int = 3000
    num_test: int = 1000
    num_features: int = 64
    num_labels: int = 20
    num_groups: int = 5
    cooccurrence: float = 0.3
    noise_label_rate: float = 0.01
    group_similarity: float = 0.5
    feature_noise: float = 0.6
    zipf: float = 0.8


def make_synthetic(spec: SyntheticSpec, *, seed: int = 0) -> MultiLabelDataset:
    """Generate a train/test pair from ``spec`` deterministically from ``seed``."""
    if spec.num_groups < 1 or spec.num_groups > spec.num_labels:
        raise ValueError("num_groups must be in [1, num_labels]")
    rng = np.random.default_rng(seed)
    L, D = spec.num_labels, spec.num_features
    group_of = np.arange(L) % spec.num_groups
    group_centres = rng.standard_normal((spec.num_groups, D))
    own = rng.standard_normal((L, D))
    s = spec.group_similarity
    centroids = np.sqrt(s) * group_centres[group_of] + np.sqrt(1 - s) * own
    freq = 1.0 / np.arange(1, L + 1) ** spec.zipf
    freq = freq[rng.permutation(L)]
    freq /= freq.sum()
    members = [np.flatnonzero(group_of == g) for g in range(spec.num_groups)]

    def split(n: int) -> MultiLabelSplit:
        primary = rng.choice(L, size=n, p=freq)
        y = np.zeros((n, L), dtype=np.int8)
        y[np.arange(n), primary] = 1
        for i, p in enumerate(primary):
            mates = members[group_of[p]]
            y[i, mates[rng.random(len(mates)) < spec.cooccurrence]] = 1
        y |= (rng.random((n, L)) < spec.noise_label_rate).astype(np.int8)
        x = (y @ centroids) / y.sum(axis=1, keepdims=True)
        x += spec.feature_noise * rng.standard_normal((n, D))
        return MultiLabelSplit(sp.csr_matrix(x.astype(np.float32)), sp.csr_matrix(y))

    train, test = split(spec.num_train), split(spec.num_test)
    return MultiLabelDataset(
        name="synthetic",
        train=train,
        test=test,
        label_names=[f"label_{i:03d}" for i in range(L)],
        feature_kind="dense",
        meta={"spec": spec.__dict__, "seed": seed},
    )
