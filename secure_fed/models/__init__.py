"""Models: encoders g_θ (text network, MLP, torchvision ResNets) and the model families built around them."""

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


def build_encoder(
    name: str,
    in_dim: int,
    *,
    embedding_dim: int,
    hidden_dims: list[int],
    embed_dim: int = 512,
    image_shape: tuple[int, int, int] | None = None,
    weights: str | None = None,
) -> nn.Module:
    """The encoder g_θ called ``name``, mapping rows of ``in_dim`` features to ``embedding_dim``.

    ``sparse_text`` and ``mlp`` use ``hidden_dims`` (and ``embed_dim``); ``resnet18`` and ``resnet50`` need the rows'
    ``image_shape`` ``(C, H, W)`` and ``weights`` (a torchvision state-dict file or ``"random"``; see
    :mod:`secure_fed.models.backbones`, imported only here so that torchvision loads only for ResNets).
    """
    if name == "sparse_text":
        return SparseTextEncoder(in_dim, embed_dim=embed_dim, hidden_dims=tuple(hidden_dims), out_dim=embedding_dim)
    if name == "mlp":
        return MLPEncoder(in_dim, hidden_dims=tuple(hidden_dims), out_dim=embedding_dim)
    if name in ("resnet18", "resnet50"):
        from secure_fed.models.backbones import ResNetEncoder

        if image_shape is None or weights is None:
            raise ValueError(f"model '{name}' needs image_shape and weights")
        enc = ResNetEncoder(name, image_shape, out_dim=embedding_dim, weights=weights)
        if enc.in_dim != in_dim:
            raise ValueError(f"image shape {image_shape} does not match rows of {in_dim} features")
        return enc
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
