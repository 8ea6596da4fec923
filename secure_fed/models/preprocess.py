"""Feature preprocessing fitted on the training split only (CSR or dense features alike)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from secure_fed.data.dataset import Features, as_dense, row_nnz
from secure_fed.model_choices import SPARSE_KINDS  # kinds that map zeros to zeros (transform_sparse)

#: ImageNet's per-channel (R, G, B) mean and standard deviation of pixels in [0, 1]: public constants (the
#: statistics torchvision's ImageNet weights were trained with), never statistics of the private data
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

KINDS = ("rsqrt_nnz", "standardize", "image", "none")

#: rows transformed at a time by the ``image`` kind (bounds the float64-free temporary memory)
_CHUNK = 4096


@dataclass
class Preprocessor:
    """``rsqrt_nnz`` scales each row by 1/sqrt(nnz) (sparse text; no shared statistics);
    ``standardize`` centres and scales each feature with statistics of the whole
    training split (dense data). The latter is computed centrally, a simulation
    convenience that a deployment would replace by public or securely aggregated
    statistics. ``image`` maps pixels to [0, 1] (uint8 divided by 255; float pixels are taken to be in [0, 1]
    already) and normalises each channel with the public ImageNet mean and std (:data:`IMAGENET_MEAN`,
    :data:`IMAGENET_STD`), so it uses no statistic of the data; rows are flattened RGB images in channel-major
    order, ``(3*H*W,)``. ``none`` returns the features as float32.

    Every kind takes a CSR matrix or a dense array and returns a dense float32 array ``(n, D)``."""

    kind: str
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    @classmethod
    def fit(cls, kind: str, x: Features) -> Preprocessor:
        """A preprocessor of ``kind``; ``standardize`` takes its statistics from ``x`` (the training split)."""
        if kind == "standardize":
            dense = as_dense(x)
            std = dense.std(axis=0)
            return cls(kind, dense.mean(axis=0), np.where(std > 0, std, 1.0))
        if kind == "image":
            if x.shape[1] % len(IMAGENET_MEAN):
                raise ValueError(f"preprocessing 'image' needs RGB rows (3*H*W values); got rows of {x.shape[1]}")
            return cls(kind, np.asarray(IMAGENET_MEAN, np.float32), np.asarray(IMAGENET_STD, np.float32))
        if kind not in KINDS:
            raise ValueError(f"unknown preprocessing '{kind}'")
        return cls(kind)

    def transform(self, x: Features) -> np.ndarray:
        """``x`` preprocessed: a dense float32 array of the same shape."""
        if self.kind == "rsqrt_nnz":
            return (as_dense(x, np.float32) * _rsqrt_nnz(x)[:, None]).astype(np.float32, copy=False)
        if self.kind == "standardize":
            return ((as_dense(x) - self.mean) / self.std).astype(np.float32)
        if self.kind == "image":
            return self._normalise_images(as_dense(x))
        return np.array(as_dense(x), dtype=np.float32)  # a copy: the caller may write to it

    def transform_sparse(self, x: Features) -> sp.csr_matrix:
        """``x`` preprocessed as a float32 CSR matrix, for the kinds that keep zeros zero (``rsqrt_nnz``, ``none``);
        the same values as :meth:`transform`'s, without the zeros."""
        if self.kind not in SPARSE_KINDS:
            raise ValueError(f"preprocessing '{self.kind}' does not keep rows sparse (only {', '.join(SPARSE_KINDS)} do)")
        m = sp.csr_matrix(x, dtype=np.float32, copy=True)
        if self.kind == "rsqrt_nnz":
            m.data *= np.repeat(_rsqrt_nnz(x), np.diff(m.indptr))
        return m

    def _normalise_images(self, x: np.ndarray) -> np.ndarray:
        n, d = x.shape
        c = len(self.mean)
        if d % c:
            raise ValueError(f"preprocessing 'image' needs RGB rows (3*H*W values); got rows of {d}")
        scale = np.float32(1 / 255) if x.dtype == np.uint8 else np.float32(1)
        out = np.empty((n, d), np.float32)
        mean, inv_std = self.mean.reshape(1, c, 1), (1 / self.std).reshape(1, c, 1).astype(np.float32)
        for start in range(0, n, _CHUNK):
            block = x[start : start + _CHUNK].reshape(-1, c, d // c).astype(np.float32) * scale
            out[start : start + _CHUNK] = ((block - mean) * inv_std).reshape(-1, d)
        return out


def _rsqrt_nnz(x: Features) -> np.ndarray:
    """(n,) float32: 1/sqrt(non-zeros) of each row (1 for an empty row), the ``rsqrt_nnz`` scale."""
    return 1.0 / np.sqrt(np.maximum(row_nnz(x).astype(np.float32), 1.0))
