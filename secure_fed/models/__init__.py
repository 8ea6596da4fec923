"""Models: embedding-based classifiers f(x) = W·g_θ(x) with L2-normalised rows and embeddings."""

from __future__ import annotations

from torch import nn

from secure_fed.catalog import MODELS as CATALOG
from secure_fed.models.encoders import (
    MLPEncoder,
    SparseTextEncoder,
    mean_pairwise_cosine,
    normalized_scores,
    spread_init,
)
from secure_fed.models.preprocess import Preprocessor

MODELS = CATALOG


def build_encoder(name: str, in_dim: int, *, embedding_dim: int, hidden_dims: list[int], embed_dim: int = 512) -> nn.Module:
    if name == "sparse_text":
        return SparseTextEncoder(in_dim, embed_dim=embed_dim, hidden_dims=tuple(hidden_dims), out_dim=embedding_dim)
    if name == "mlp":
        return MLPEncoder(in_dim, hidden_dims=tuple(hidden_dims), out_dim=embedding_dim)
    raise ValueError(f"unknown model '{name}'")


__all__ = [
    "MODELS",
    "MLPEncoder",
    "Preprocessor",
    "SparseTextEncoder",
    "build_encoder",
    "mean_pairwise_cosine",
    "normalized_scores",
    "spread_init",
]
