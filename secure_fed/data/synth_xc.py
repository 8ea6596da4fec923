"""Synthetic data in the shape of the extreme-classification benchmarks, written as XC files.

``secure-fed data synth-xc --like amazoncat-13k --scale 0.01 --out DIR`` writes ``DIR/train.txt`` and
``DIR/test.txt`` in the XC repository's format (:mod:`secure_fed.data.xc`) with the published shape of the named
data set (instances, features, labels, labels per instance) scaled by ``--scale`` (instances and labels alike, so
instances per label stay as published; features are kept). They go through the same reader, partitioner and
training as the real files, so memory and time measured on them are the real path's.

The generator (seeded, streamed in chunks of rows, so memory stays O(chunk)):

* label frequencies follow a Zipf law (popularity ∝ rank^−a, a = :data:`ZIPF_A`), as XC label frequencies do;
* an instance's label count is 1 + Poisson(mean − 1); its first label is drawn by popularity and the rest mostly
  from that label's *topic* (labels are grouped into topics of :data:`TOPIC_SIZE` consecutive ranks, shuffled),
  so labels co-occur with structure, as FedALC's label correlations assume;
* features: each label owns a few *signature* features; an instance holds some signature features of each of its
  labels plus Zipf-distributed background features up to the published mean count of non-zeros per row, with
  positive tf-idf-like values. A model can learn the labels from the features.

The shapes are those of the XC repository's table (http://manikvarma.org/downloads/XC/XMLRepository.html); the
mean non-zeros per row are approximate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from secure_fed.errors import DataError


@dataclass(frozen=True)
class XCShape:
    """A benchmark's published shape."""

    train: int
    test: int
    features: int
    labels: int
    labels_per_instance: float
    nnz_per_row: float


SHAPES: dict[str, XCShape] = {
    "eurlex-4k": XCShape(15_539, 3_809, 5_000, 3_993, 5.31, 236.8),
    "amazoncat-13k": XCShape(1_186_239, 306_782, 203_882, 13_330, 5.04, 71.1),
    "wiki-325k": XCShape(1_778_351, 587_084, 1_617_899, 325_056, 3.19, 42.1),
    "amazon-670k": XCShape(490_449, 153_025, 135_909, 670_091, 5.45, 75.7),
}

ZIPF_A = 0.9
#: background features: Zipf over the features (flatter than labels, so rows keep their published non-zero count)
FEATURE_ZIPF_A = 0.6
TOPIC_SIZE = 64
#: signature features per label, and the share of an instance's labels' signatures it holds
SIGNATURE = 8
CHUNK_ROWS = 65_536


def scaled_shape(like: str, scale: float) -> XCShape:
    """``like``'s shape with instances and labels multiplied by ``scale`` (features kept)."""
    if like not in SHAPES:
        raise DataError(f"synth-xc: unknown shape {like!r} (choose from {', '.join(SHAPES)})")
    if not 0 < scale <= 1:
        raise DataError(f"synth-xc: --scale must be in (0, 1], got {scale}")
    s = SHAPES[like]
    labels = max(8, int(round(s.labels * scale)))
    return XCShape(
        max(16, int(round(s.train * scale))), max(8, int(round(s.test * scale))), s.features, labels,
        min(s.labels_per_instance, labels / 2), min(s.nnz_per_row, s.features / 4),
    )  # fmt: skip


class _Generator:
    def __init__(self, shape: XCShape, seed: int):
        self.shape = shape
        rng = np.random.default_rng([seed, 0x5C])
        L, D = shape.labels, shape.features
        pop = 1.0 / np.arange(1, L + 1) ** ZIPF_A
        self.label_of_rank = rng.permutation(L)  # rank r's label id (ids carry no order)
        self.pop_cdf = np.cumsum(pop / pop.sum())
        self.topic_order = rng.permutation(L)  # ranks grouped into topics after a shuffle: co-occurring labels
        self.topic_pos = np.empty(L, np.int64)
        self.topic_pos[self.topic_order] = np.arange(L)
        self.signatures = rng.integers(0, D, size=(L, SIGNATURE))
        fpop = 1.0 / np.arange(1, D + 1) ** FEATURE_ZIPF_A
        self.feat_cdf = np.cumsum(fpop / fpop.sum())
        self.feat_perm = rng.permutation(D)

    def rows(self, n: int, rng: np.random.Generator) -> tuple[sp.csr_matrix, sp.csr_matrix]:
        s, L = self.shape, self.shape.labels
        k = np.minimum(1 + rng.poisson(s.labels_per_instance - 1, size=n), L)
        first = np.searchsorted(self.pop_cdf, rng.random(n))
        lab_rows = np.repeat(np.arange(n), k)
        starts = np.repeat(np.cumsum(k) - k, k)
        slot = np.arange(k.sum()) - starts
        # later labels: 70% from the first label's topic, 30% by popularity
        topic_base = (self.topic_pos[np.repeat(first, k)] // TOPIC_SIZE) * TOPIC_SIZE
        in_topic = self.topic_order[np.minimum(topic_base + rng.integers(0, TOPIC_SIZE, k.sum()), L - 1)]
        by_pop = np.searchsorted(self.pop_cdf, rng.random(k.sum()))
        ranks = np.where(slot == 0, np.repeat(first, k), np.where(rng.random(k.sum()) < 0.7, in_topic, by_pop))
        ranks = np.minimum(ranks, L - 1)
        labels = sp.csr_matrix((np.ones(len(ranks), np.int8), (lab_rows, self.label_of_rank[ranks])), shape=(n, L))
        labels.sum_duplicates()
        labels.data[:] = 1
        # features: half of each label's signature, plus background up to the mean count
        sig_rows = np.repeat(lab_rows, SIGNATURE // 2)
        sig_cols = self.signatures[ranks][:, : SIGNATURE // 2].ravel()
        n_bg = np.maximum(1, rng.poisson(max(1.0, s.nnz_per_row - SIGNATURE // 2 * s.labels_per_instance), size=n))
        bg_rows = np.repeat(np.arange(n), n_bg)
        bg_cols = self.feat_perm[np.minimum(np.searchsorted(self.feat_cdf, rng.random(n_bg.sum())), s.features - 1)]
        rows = np.concatenate([sig_rows, bg_rows])
        cols = np.concatenate([sig_cols, bg_cols])
        vals = rng.gamma(2.0, 0.5, size=len(rows)).astype(np.float32) + 0.1
        feats = sp.csr_matrix((vals, (rows, cols)), shape=(n, s.features), dtype=np.float32)
        feats.sum_duplicates()
        return feats, labels


def write_xc(path: Path, feats_chunks, n: int, d: int, num_labels: int) -> None:
    """Write XC rows chunk by chunk: the ``N D L`` header, then ``l1,l2 f:v …`` (0-based) per row."""
    with path.open("w", encoding="utf-8") as fh:
        fh.write(f"{n} {d} {num_labels}\n")
        for feats, labels in feats_chunks:
            for i in range(feats.shape[0]):
                lo, hi = labels.indptr[i], labels.indptr[i + 1]
                flo, fhi = feats.indptr[i], feats.indptr[i + 1]
                labs = ",".join(map(str, np.sort(labels.indices[lo:hi])))
                pairs = " ".join(f"{j}:{v:.4g}" for j, v in zip(feats.indices[flo:fhi], feats.data[flo:fhi], strict=True))
                fh.write(f"{labs} {pairs}\n" if labs else f" {pairs}\n")


def synth_xc(like: str, *, out: str | Path, scale: float = 1.0, seed: int = 0, progress=None) -> XCShape:
    """Write ``out/train.txt`` and ``out/test.txt`` shaped like ``like`` (scaled); returns the shape written."""
    shape = scaled_shape(like, scale)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gen = _Generator(shape, seed)
    for name, n, stream in (("train", shape.train, 1), ("test", shape.test, 2)):
        rng = np.random.default_rng([seed, stream])

        def chunks(n=n, rng=rng, name=name):
            for start in range(0, n, CHUNK_ROWS):
                yield gen.rows(min(CHUNK_ROWS, n - start), rng)
                if progress is not None:
                    progress(name, min(start + CHUNK_ROWS, n), n)

        write_xc(out / f"{name}.txt", chunks(), n, shape.features, shape.labels)
    return shape
