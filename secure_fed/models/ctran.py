"""C-Tran (Lanchantin et al., CVPR 2021) as FedLGT uses it (the FedLGT paper, §3.2), and FedLGT's client-side parts.

The model: feature tokens from a backbone and one token per label, through a transformer encoder, one logit per
label token::

    label token l = E_label[l] + E_state[s_l]        s_l ∈ {unknown, positive, negative}; E_state[unknown] = 0
    h = TransformerEncoder([feature tokens; label tokens])
    logit_l = ⟨h_label_l, a_l⟩ + b_l                 (one weight vector per label)

**Feature tokens** (:class:`ChunkTokens`, :class:`ResNetTokens`, :class:`EncoderTokens`):

* images: the ResNet's last spatial map (7×7 for 224-px images → 49 tokens), each position projected to the width;
* dense Mulan data: the feature vector cut into tokens. Mulan's scene (294 features) stores six colour moments
  (L, U, V mean and variance) of 7×7 = 49 image blocks *moment-major* (feature j·49 + b is moment j of block b,
  checked from the per-feature means), so ``tokens: auto`` makes its 49 tokens of 6 with ``feature_major``; other
  dense sets are cut into consecutive chunks of ``model.ctran.token_size`` features (zero-padded);
* sparse text (bibtex): the existing text network's output, projected to ``model.ctran.text_tokens`` tokens.

A learned position embedding is added to the feature tokens.

**Label mask training** (C-Tran §3.2, :func:`label_mask_states`): per training sample, a uniformly drawn number
of labels in [⌈¼ L⌉, L] is unknown (``model.ctran.min_unknown`` = ¼ as in C-Tran), the others are given with
their true state, and the loss is taken only on the unknown labels (:func:`masked_loss`). At inference every
label is unknown.

**Universal label embeddings** (FedLGT §3.3): with ``label_source="text"``, E_label is a frozen text-encoder
embedding of each label's prompt and E_state of the words "positive" and "negative" (unknown stays the zero
vector), both mapped to the width by one trained linear map. The text embeddings are *buffers*, not parameters:
they are not in θ, so no update carries them and the server never averages them; each client computes them from
the public label names (:func:`secure_fed.models.text_encoder.universal_label_embeddings`).

**CA-MLE** (FedLGT eq. 4, :func:`ca_mle_unknown`): in each local step the global model the client received
scores every sample of the batch with all labels unknown; labels whose probability is within ε of τ become
unknown (are trained on), the others keep their label-mask state (or, with ``algorithm.ca_mle_random_mask:
false``, their true state: see :mod:`secure_fed.algorithms.fedlgt`). The authors' code applies it to the first
sample of each batch only (feeding the global model the label-mask states) and swaps the positive/negative
prompts; this follows the paper.

Choices of this implementation beyond the papers: a learned position embedding on the feature tokens, post-norm
encoder layers (PyTorch's default) with a final LayerNorm on the label tokens, feed-forward width 2× the model
width, and the loss averaged (not summed) over the unknown labels.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

#: state indices of a label token
UNKNOWN, POSITIVE, NEGATIVE = 0, 1, 2


class ChunkTokens(nn.Module):
    """A dense feature row cut into ``num_tokens`` tokens of ``token_size`` features, each projected to ``width``.

    ``feature_major``: feature j of token t is column ``j * num_tokens + t`` (scene's moment-major layout);
    else token t is the consecutive columns ``t * token_size …`` (zero-padded at the end)."""

    def __init__(self, in_dim: int, *, token_size: int, width: int, feature_major: bool = False):
        super().__init__()
        self.in_dim, self.token_size, self.feature_major = in_dim, token_size, feature_major
        self.num_tokens = math.ceil(in_dim / token_size)
        if feature_major and self.num_tokens * token_size != in_dim:
            raise ValueError(f"feature_major tokens need {in_dim} features to be a multiple of {token_size}")
        self.proj = nn.Linear(token_size, width)
        self.position = nn.Parameter(torch.randn(self.num_tokens, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` → ``(B, T, width)``."""
        B = x.shape[0]
        if self.feature_major:
            tok = x.reshape(B, self.token_size, self.num_tokens).transpose(1, 2)
        else:
            pad = self.num_tokens * self.token_size - self.in_dim
            tok = F.pad(x, (0, pad)).reshape(B, self.num_tokens, self.token_size)
        return self.proj(tok) + self.position


class ResNetTokens(nn.Module):
    """The ResNet's last spatial map (before pooling), one token per position, projected to ``width``."""

    def __init__(self, encoder: nn.Module, *, width: int):
        super().__init__()
        self.encoder = encoder
        self.encoder.resnet.fc = nn.Identity()  # the pooled head is not used: no parameter that never trains
        channels = encoder.resnet.layer4[-1].conv1.in_channels
        self.num_tokens = _spatial_side(encoder.image_shape[1]) * _spatial_side(encoder.image_shape[2])
        self.proj = nn.Linear(channels, width)
        self.position = nn.Parameter(torch.randn(self.num_tokens, width) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.encoder.resnet
        z = x.reshape(x.shape[0], *self.encoder.image_shape)
        z = r.maxpool(r.relu(r.bn1(r.conv1(z))))
        z = r.layer4(r.layer3(r.layer2(r.layer1(z))))  # (B, C', h, w)
        return self.proj(z.flatten(2).transpose(1, 2)) + self.position


def _spatial_side(side: int) -> int:
    """The side of a torchvision ResNet's last feature map for an input side (five stride-2 stages)."""
    for _ in range(5):
        side = (side - 1) // 2 + 1
    return side


class EncoderTokens(nn.Module):
    """An encoder's output vector (e.g. the sparse text network's) projected to ``num_tokens`` tokens."""

    def __init__(self, encoder: nn.Module, *, out_dim: int, num_tokens: int, width: int):
        super().__init__()
        self.encoder, self.num_tokens, self.width = encoder, num_tokens, width
        self.proj = nn.Linear(out_dim, num_tokens * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.encoder(x))).reshape(x.shape[0], self.num_tokens, self.width)


class CTran(nn.Module):
    """C-Tran over feature tokens from ``tokens``; ``forward(x, states)`` gives ``(B, L)`` logits.

    ``label_source``: ``"learned"`` (C-Tran's own label and state embeddings) or ``"text"`` (FedLGT's ULE: call
    :meth:`set_text_embeddings` before use; the text embeddings are buffers, outside θ)."""

    def __init__(
        self,
        tokens: nn.Module,
        *,
        num_labels: int,
        width: int,
        layers: int = 3,
        heads: int = 4,
        dropout: float = 0.1,
        min_unknown: float = 0.25,
        label_source: str = "learned",
        text_dim: int | None = None,
    ):
        super().__init__()
        if label_source not in ("learned", "text"):
            raise ValueError(f"label_source must be learned or text, not {label_source!r}")
        self.tokens, self.num_labels, self.width = tokens, num_labels, width
        self.min_unknown, self.label_source = min_unknown, label_source
        if label_source == "learned":
            self.label_embedding = nn.Parameter(torch.randn(num_labels, width) * 0.02)
            self.state_embedding = nn.Parameter(torch.randn(2, width) * 0.02)  # positive, negative; unknown = 0
        else:
            if text_dim is None:
                raise ValueError("label_source='text' needs text_dim")
            self.text_proj = nn.Linear(text_dim, width)
            self.register_buffer("text_labels", torch.zeros(num_labels, text_dim), persistent=False)
            self.register_buffer("text_states", torch.zeros(2, text_dim), persistent=False)
            self.text_ready = False
        layer = nn.TransformerEncoderLayer(width, heads, dim_feedforward=2 * width, dropout=dropout, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head_weight = nn.Parameter(torch.randn(num_labels, width) / math.sqrt(width))
        self.head_bias = nn.Parameter(torch.zeros(num_labels))

    @torch.no_grad()
    def set_text_embeddings(self, labels: np.ndarray | torch.Tensor, states: np.ndarray | torch.Tensor) -> None:
        """ULE: the frozen text embeddings of the label prompts ``(L, e)`` and of "positive", "negative" ``(2, e)``."""
        labels, states = torch.as_tensor(labels, dtype=torch.float32), torch.as_tensor(states, dtype=torch.float32)
        if tuple(labels.shape) != tuple(self.text_labels.shape) or tuple(states.shape) != tuple(self.text_states.shape):
            raise ValueError(f"text embeddings of shape {tuple(labels.shape)}, {tuple(states.shape)} do not fit the model")
        self.text_labels.copy_(labels)
        self.text_states.copy_(states)
        self.text_ready = True

    def _embeddings(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.label_source == "learned":
            return self.label_embedding, self.state_embedding
        if not self.text_ready:
            raise RuntimeError("C-Tran with universal label embeddings: set_text_embeddings was not called")
        return self.text_proj(self.text_labels), self.text_proj(self.text_states)

    def forward(self, x: torch.Tensor, states: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``(B, L)``; ``states`` ``(B, L)`` of UNKNOWN / POSITIVE / NEGATIVE (None: all unknown)."""
        feat = self.tokens(x)
        label_emb, state_emb = self._embeddings()
        lab = label_emb.unsqueeze(0).expand(x.shape[0], -1, -1)
        if states is not None:
            table = torch.cat([torch.zeros_like(state_emb[:1]), state_emb])  # unknown = the zero vector
            lab = lab + table[states]
        h = self.transformer(torch.cat([feat, lab.to(feat.dtype)], dim=1))
        out = self.norm(h[:, feat.shape[1] :])
        return (out * self.head_weight).sum(-1) + self.head_bias


def label_mask_states(targets: torch.Tensor, min_unknown: float, generator: torch.Generator) -> torch.Tensor:
    """C-Tran's label mask training: ``(B, L)`` states, per sample a number of unknown labels drawn uniformly from
    [⌈min_unknown·L⌉, L], the unknown ones chosen uniformly; the rest POSITIVE or NEGATIVE from ``targets``."""
    B, L = targets.shape
    low = max(1, math.ceil(min_unknown * L))
    n_unknown = torch.randint(low, L + 1, (B, 1), generator=generator)
    ranks = torch.rand(B, L, generator=generator).argsort(dim=1).argsort(dim=1)  # a random order of each row
    return _states(targets, ranks < n_unknown)


def label_mask_states_keyed(targets: torch.Tensor, min_unknown: float, uniforms: torch.Tensor) -> torch.Tensor:
    """:func:`label_mask_states` from given ``(B, L + 1)`` uniforms, row i drawn for sample i alone (under DP-SGD:
    keyed by the instance, :meth:`~secure_fed.algorithms.per_sample.GradientPrivatizer.instance_uniforms`): the
    number of unknown labels from column 0, the order of the labels from the rest."""
    B, L = targets.shape
    low = max(1, math.ceil(min_unknown * L))
    u = uniforms.to(torch.float64)
    n_unknown = (low + (u[:, :1] * (L + 1 - low)).floor().long()).clamp(max=L)
    ranks = u[:, 1:].argsort(dim=1).argsort(dim=1)
    return _states(targets, ranks < n_unknown)


def _states(targets: torch.Tensor, unknown: torch.Tensor) -> torch.Tensor:
    unknown = unknown.to(targets.device)
    known_state = torch.where(targets.bool(), POSITIVE, NEGATIVE)
    return torch.where(unknown, UNKNOWN, known_state)


def ca_mle_unknown(probabilities: torch.Tensor, tau: float, epsilon: float) -> torch.Tensor:
    """FedLGT eq. 4: True where τ − ε ≤ p ≤ τ + ε (the global model is uncertain: the label becomes unknown)."""
    return (probabilities >= tau - epsilon) & (probabilities <= tau + epsilon)


def masked_loss(loss_fn, logits: torch.Tensor, targets: torch.Tensor, unknown: torch.Tensor) -> torch.Tensor:
    """``loss_fn`` (bce or asl, elementwise via ``reduction="none"``) averaged over the unknown labels only."""
    elem = loss_fn(logits, targets, reduction="none")
    mask = unknown.to(elem.dtype)
    return (elem * mask).sum() / mask.sum().clamp(min=1.0)
