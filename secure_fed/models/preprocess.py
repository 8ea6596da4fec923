"""Feature preprocessing fitted on the training split only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


@dataclass
class Preprocessor:
    """``rsqrt_nnz`` scales each row by 1/sqrt(nnz) (sparse text; no shared statistics);
    ``standardize`` centres and scales each feature with statistics of the whole
    training split (dense data). The latter is computed centrally, a simulation
    convenience that a deployment would replace by public or securely aggregated
    statistics."""

    kind: str
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    @classmethod
    def fit(cls, kind: str, x: sp.csr_matrix) -> Preprocessor:
        if kind == "standardize":
            dense = x.toarray()
            std = dense.std(axis=0)
            return cls(kind, dense.mean(axis=0), np.where(std > 0, std, 1.0))
        if kind not in ("rsqrt_nnz", "none"):
            raise ValueError(f"unknown preprocessing '{kind}'")
        return cls(kind)

    def transform(self, x: sp.csr_matrix) -> np.ndarray:
        if self.kind == "rsqrt_nnz":
            nnz = np.diff(x.indptr).astype(np.float32)
            scale = 1.0 / np.sqrt(np.maximum(nnz, 1.0))
            return np.asarray(sp.diags(scale) @ x.toarray(), dtype=np.float32)
        if self.kind == "standardize":
            return ((x.toarray() - self.mean) / self.std).astype(np.float32)
        return x.toarray().astype(np.float32)
