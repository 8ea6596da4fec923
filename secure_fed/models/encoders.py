"""Instance encoders g_θ and the embedding classifier f(x) = W·g_θ(x)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from secure_fed.models.sparse_rows import SparseInputLinear


def _init_kaiming(module: nn.Module) -> None:
    """Kaiming-normal weights and zero biases.

    PyTorch's default init left every Bibtex instance embedding at pairwise
    cosine ≈ 0.998 (bias-dominated) and nothing trained; this init does not.
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def orthogonal_init(module: nn.Module) -> None:
    """Orthogonal weights (gain √2, Kaiming's scale for ReLU layers) and zero biases, in place.

    A weight of shape ``(out, in)`` with out ≤ in gets orthonormal rows (times the gain), and a product of such maps
    has orthonormal rows too, so a linear encoder (``hidden_dims: []``: the embedding, then one linear map) is a
    scaled projection onto a random ``out``-dimensional subspace: it keeps the inputs' inner products within that
    subspace exactly, where a product of Gaussian matrices spreads its singular values (the Bibtex recipe without
    noise on its validation split: 35.9 P@1 over two Kaiming layers to 256, 41.3 over the orthogonal projection to
    256, 47.3 to 512; ``results/private_recipes/README.md``)."""
    gain = nn.init.calculate_gain("relu")
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight, gain=gain)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


#: ``model.encoder_init``: how the sparse_text and mlp encoders' linear layers start
ENCODER_INITS = {"kaiming": _init_kaiming, "orthogonal": orthogonal_init}


class SparseTextEncoder(nn.Module):
    """The FedAwS/FedALC text network (FedALC §V-B).

    A linear embedding of the sparse input to ``embed_dim`` (512), then layers
    of ``hidden_dims`` (1024, 1024) with ReLU, then a linear map to ``out_dim``
    (512). The output is L2-normalised by :class:`EmbeddingClassifier`.
    Inputs are expected pre-scaled (see ``secure_fed.models.preprocess``), as a dense ``(n, D)`` tensor or as
    :class:`~secure_fed.models.sparse_rows.SparseRows` (extreme-classification data: the first layer is then an
    embedding bag, the paper's "embedding lookup followed by averaging", with the same weight).
    """

    def __init__(self, in_dim: int, *, embed_dim: int = 512, hidden_dims: tuple[int, ...] = (1024, 1024), out_dim: int = 512):
        super().__init__()
        self.embed = SparseInputLinear(in_dim, embed_dim, bias=False)  # reads dense rows or SparseRows
        layers: list[nn.Module] = []
        prev = embed_dim
        for h in hidden_dims:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        layers.append(nn.Linear(prev, out_dim))
        self.body = nn.Sequential(*layers)
        _init_kaiming(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.embed(x))

    def chain(self) -> list[nn.Module]:
        """The forward pass as a chain of ``nn.Linear`` and ``nn.ReLU`` modules (what the vectorised executor's
        batched SGD runs: :mod:`secure_fed.algorithms.batched_sgd`)."""
        return [self.embed, *self.body]


class MLPEncoder(nn.Module):
    """A ReLU MLP for dense numeric features."""

    def __init__(self, in_dim: int, *, hidden_dims: tuple[int, ...] = (256,), out_dim: int = 128):
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_dim
        for h in hidden_dims:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        layers.append(nn.Linear(prev, out_dim))
        self.body = nn.Sequential(*layers)
        _init_kaiming(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def chain(self) -> list[nn.Module]:
        """The forward pass as a chain of ``nn.Linear`` and ``nn.ReLU`` modules."""
        return list(self.body)


def normalized_scores(encoder: nn.Module, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Scores f(x) = normalize(W) · normalize(g_θ(x)); each in [-1, 1]."""
    return F.normalize(encoder(x), dim=-1) @ F.normalize(W, dim=-1).T


def spread_init(num_classes: int, dim: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random unit rows: in high dimension these are nearly orthogonal ("spread out")."""
    W = torch.randn(num_classes, dim, generator=generator)
    return F.normalize(W, dim=-1)


def mean_pairwise_cosine(W: torch.Tensor) -> float:
    """Mean cosine over all pairs i ≠ j of W's rows: 1.0 means total collapse."""
    C = W.shape[0]
    if C < 2:
        return float("nan")
    if C * W.shape[1] <= _COSINE_CHUNK:  # one expression (the figure the golden runs recorded)
        Wn = F.normalize(W.detach().float(), dim=-1)
        s = Wn.sum(dim=0)
        total = float(s @ s) - float((Wn * Wn).sum())
        return total / (C * (C - 1))
    s, sq = torch.zeros(W.shape[1], dtype=torch.float64, device=W.device), 0.0
    rows = max(1, _COSINE_CHUNK // W.shape[1])
    for a in range(0, C, rows):  # an XC-sized W: rows normalised a chunk at a time, no second copy of W
        Wn = F.normalize(W[a : a + rows].detach().float(), dim=-1)
        s += Wn.sum(dim=0, dtype=torch.float64)
        sq += float((Wn * Wn).sum(dtype=torch.float64))
    return (float(s @ s) - sq) / (C * (C - 1))


#: elements of W normalised at once by :func:`mean_pairwise_cosine`
_COSINE_CHUNK = 2**24
