"""Model families: what the server's model is, how it scores an instance, and which part a client may see.

The engine holds the server's model as named tensors (:class:`~secure_fed.engine.state.ServerState`):

* ``theta`` — the parameters of a module every participating client receives whole;
* ``W`` — optionally, a **row table** with one row per label, of which a client receives only the rows of the
  labels it holds (the positive-only papers' class embeddings).

A family says how to build both and how to score. The engine assumes nothing else about the model:

=================  ===========================================================  ==========  ===================
family             scores                                                       row table   algorithms
=================  ===========================================================  ==========  ===================
``embedding``      f(x) = normalize(W) · normalize(g_θ(x)) (FedAwS/FedALC §III)  yes (C × d)  all positive-only
``linear_head``    f(x) = A · g_θ(x) + b, logits; A, b are part of θ            no          ``fedavg``, ``flag``
``ctran``          C-Tran: feature and label tokens through a transformer      no          ``fedctran``, ``fedlgt``
=================  ===========================================================  ==========  ===================

A family whose :attr:`~ModelFamily.label_masked` is set trains with C-Tran's label mask training
(:meth:`~ModelFamily.masked_training_loss`); its model is built by :func:`secure_fed.engine.builders.build_model`.

Families register in :data:`FAMILIES` (and through the ``secure_fed.model_families`` entry points).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from secure_fed.models.encoders import spread_init


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32 when it is half precision (autocast output); fp32 and fp64 as they are."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


class ModelFamily:
    """Base class: a family of models, given an encoder g_θ built from the ``model`` config."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: the server keeps a per-label row table W (clients see only their own rows)
    has_rows: ClassVar[bool] = False
    #: the client loss this family's scores need (None: the algorithm's own)
    default_loss: ClassVar[str | None] = None
    #: local training gives part of each label vector as input and takes the loss on the rest (C-Tran)
    label_masked: ClassVar[bool] = False
    #: :meth:`score` takes leading batch dimensions ((G, B, d) outputs and (G, k, d) rows give (G, B, k) scores),
    #: so the vectorised executor calls it on many clients at once instead of through ``vmap``
    batched_score: ClassVar[bool] = False

    def build(self, encoder: nn.Module, *, num_labels: int, embedding_dim: int) -> nn.Module:
        """θ's module, built around ``encoder`` (whose output width is ``embedding_dim``)."""
        return encoder

    def init_rows(self, num_labels: int, embedding_dim: int, *, generator: torch.Generator) -> torch.Tensor | None:
        """W at round 0, or None for a family without a row table."""
        return None

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The model's output for a batch (the part a trainer may run under autocast)."""
        return model(x)

    def score(self, out: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """(B, k) fp32 scores from :meth:`forward`'s output against the k labels of ``rows`` (all C labels when
        the family has no row table)."""
        raise NotImplementedError

    def scores(self, model: nn.Module, rows: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        return self.score(self.forward(model, x), rows)

    def project_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """W's rows after an update (e.g. back onto the unit sphere)."""
        return rows


class CosineEmbedding(ModelFamily):
    """f(x) = W·g_θ(x) with L2-normalised rows and embeddings: the positive-only papers' model."""

    name = "embedding"
    description = "f(x) = normalize(W)·normalize(g_θ(x)); W's rows are per-label class embeddings each client sees its own of"
    has_rows = True

    def init_rows(self, num_labels: int, embedding_dim: int, *, generator: torch.Generator) -> torch.Tensor:
        return spread_init(num_labels, embedding_dim, generator=generator)

    batched_score = True

    def score(self, out: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        return F.normalize(at_least_fp32(out), dim=-1) @ F.normalize(rows, dim=-1).transpose(-1, -2)

    def project_rows(self, rows: torch.Tensor) -> torch.Tensor:
        return F.normalize(rows, dim=-1)  # rows live on the unit sphere


class LinearHeadModel(nn.Module):
    """g_θ followed by a linear multi-label head (one logit per label)."""

    def __init__(self, encoder: nn.Module, embedding_dim: int, num_labels: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(embedding_dim, num_labels)
        nn.init.zeros_(self.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))

    def chain(self) -> list[nn.Module] | None:
        """The forward pass as a chain of ``nn.Linear`` and ``nn.ReLU`` modules, when the encoder has one."""
        inner = getattr(self.encoder, "chain", None)
        return None if inner is None else [*inner(), nn.ReLU(), self.head]


class LinearHead(ModelFamily):
    """An ordinary multi-label classifier: every parameter (head included) is shared, scores are logits."""

    name = "linear_head"
    description = "g_θ → ReLU → linear head with one logit per label; the whole model is shared (general multi-label FL)"
    has_rows = False
    default_loss = "bce"

    def build(self, encoder: nn.Module, *, num_labels: int, embedding_dim: int) -> nn.Module:
        return LinearHeadModel(encoder, embedding_dim, num_labels)

    batched_score = True

    def score(self, out: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        return at_least_fp32(out)


class CTranFamily(ModelFamily):
    """C-Tran (:mod:`secure_fed.models.ctran`): label tokens with states, trained by label mask training; every
    parameter is shared, scores are logits with every label unknown."""

    name = "ctran"
    description = "C-Tran: feature tokens and label tokens (label + state embeddings) through a transformer; label mask training"
    has_rows = False
    default_loss = "bce"
    label_masked = True

    def score(self, out: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        return at_least_fp32(out)

    def label_states(
        self,
        model: nn.Module,
        x: torch.Tensor,
        targets: torch.Tensor,
        *,
        generator: torch.Generator | None,
        uncertain=None,
        random_mask: bool = True,
        uniforms: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Label mask training's input states for a batch: from :func:`~secure_fed.models.ctran.label_mask_states`
        (from ``generator``), or, given ``uniforms`` (``(B, L + 1)``, drawn per instance under DP-SGD), from
        :func:`~secure_fed.models.ctran.label_mask_states_keyed`;
        labels in ``uncertain(x)`` (CA-MLE's mask, or None) become unknown too. With CA-MLE and
        ``random_mask=False`` there is no random mask: only the uncertain labels are unknown and every other label
        is given with its true state (the FedLGT paper's §3.3 wording)."""
        from secure_fed.models.ctran import NEGATIVE, POSITIVE, UNKNOWN, label_mask_states, label_mask_states_keyed

        if uncertain is not None and not random_mask:
            states = torch.where(targets.bool(), POSITIVE, NEGATIVE)
        elif uniforms is not None:
            states = label_mask_states_keyed(targets, model.min_unknown, uniforms)
        else:
            states = label_mask_states(targets, model.min_unknown, generator)
        if uncertain is not None:
            states = torch.where(uncertain(x), UNKNOWN, states)
        return states

    def masked_training_loss(
        self,
        model: nn.Module,
        x: torch.Tensor,
        targets: torch.Tensor,
        loss_fn,
        *,
        generator: torch.Generator,
        uncertain=None,
        random_mask: bool = True,
    ) -> torch.Tensor:
        """Label mask training: states from :meth:`label_states`; the loss is on the unknown labels only."""
        from secure_fed.models.ctran import UNKNOWN, masked_loss

        states = self.label_states(model, x, targets, generator=generator, uncertain=uncertain, random_mask=random_mask)
        logits = model(x, states)
        return masked_loss(loss_fn, logits.float(), targets, states == UNKNOWN)


FAMILIES: dict[str, type[ModelFamily]] = {cls.name: cls for cls in (CosineEmbedding, LinearHead, CTranFamily)}


def model_family(name: str) -> ModelFamily:
    """The family registered as ``name`` (built-ins, then the ``secure_fed.model_families`` entry points)."""
    if name in FAMILIES:
        return FAMILIES[name]()
    from secure_fed.plugins import registry

    extra = registry("model_families")
    if name in extra:
        return extra[name]()
    from secure_fed.errors import ConfigError, unknown_name

    raise ConfigError(unknown_name("model family", name, [*FAMILIES, *extra]))
