"""The client objective: the hooks an algorithm implements into local training (:class:`ClientObjective`).

Local training has one step (:class:`~secure_fed.algorithms.client.LocalTrainer`) on three paths: the sequential
trainer, DP-SGD with per-sample gradients, and the vectorised executor's closed form. An algorithm changes what a
client minimises only through these hooks, which every path calls the same way:

* :meth:`ClientObjective.per_example_term`: a term of each example's loss (e.g. a contrastive term between the
  model's representation and the global model's). It is part
  of the example's loss, so under DP-SGD it is inside the per-sample clip.
* :meth:`ClientObjective.weight_term`: a gradient-like correction that depends only on the weights, the global
  model and the client's own state (e.g. a proximal term's gradient towards the global model, or a constant
  correction kept in the client's state). It is added to the step's gradient;
  under DP-SGD after the noise (post-processing of the private gradient: it reads no example).
* :meth:`ClientObjective.begin` / :meth:`ClientObjective.end`: before and after the client's training, with its
  own state (``ClientData.state``: kept on the client between rounds, saved with the clients' checkpoint, on Flower
  kept on the node; an algorithm whose objective keeps state declares ``keeps_client_state``).

Hooks see only the client's own data (the batch they are given), the global model (the θ the client received) and
the client's own state: :class:`ObjectiveContext` holds nothing else.

The vectorised executor trains a group of clients in one closed form (:mod:`secure_fed.algorithms.batched_sgd`).
A weight term whose gradient is affine in the weights, g(w) = a·(w − w_anchor) + b with a scalar a and tensors
w_anchor, b constant over the client's update, fits that form: the objective declares it (:attr:`ClientObjective.
affine`, :meth:`ClientObjective.affine_term` returning an :class:`AffineTerm`; a proximal term: a = its rate, the
anchor the global model, b = 0; a constant correction: a = 0, b the correction) and the batched step adds it for every
client of the group at once, with ``begin``/``end`` called around it as on the other paths. What does not fit (a
per-example term, e.g. a contrastive one that needs each client's previous model in its forward pass; a weight term
not declared affine; label mask training) runs one client at a time there, counted under the objective's name and the
reason in the summary's ``executor`` record (:meth:`ClientObjective.unbatched_reason`), never silently."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

#: ``represent(x, theta=None)``: the model's representation of a batch (the family's encoder output), with the weights
#: being trained (differentiable) or, with ``theta``, with those fixed weights (no gradient flows into them)
Represent = Callable[..., torch.Tensor]


@dataclass
class ObjectiveContext:
    """What a client's objective hooks may read: the global model, the client's own state, the step settings.

    Attributes:
        global_theta: θ as the client received it (the start of its training; detached).
        state: the client's own state (``ClientData.state``), kept between rounds; hooks may write it.
        lr: the local learning rate η.
        num_examples: how many examples the client holds (its own fact); None under DP-SGD, where it is a private
            count that no hook's output may depend on outside the clip.
        planned_steps: the optimiser steps this update will take (epochs × batches per epoch; DP-SGD's: epochs × its
            steps per epoch), known in :meth:`ClientObjective.begin`.
        steps: the optimiser steps taken so far in this update (set by the trainer; the total in :meth:`end`).
        private: the steps are DP-SGD's (a per-example term is clipped and noised with the loss).
    """

    global_theta: dict[str, torch.Tensor]
    state: dict[str, Any]
    lr: float
    num_examples: int | None
    planned_steps: int = 0
    steps: int = 0
    private: bool = False
    #: the objective's own scratch for this update (e.g. tensors prepared in :meth:`ClientObjective.begin`)
    scratch: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AffineTerm:
    """A weight term whose gradient is affine in the weights: for each parameter ``n``,
    g_n(w) = rate·(w_n − anchor_n) + offset_n, constant over the client's update (read once after
    :meth:`ClientObjective.begin`).

    Attributes:
        rate: the scalar a (a proximal term's rate; 0 for a constant correction).
        anchor: w_anchor per parameter name; None: the global model the client received (``ctx.global_theta``).
            Read only where ``rate`` is not 0.
        offset: b per parameter name (a subset of θ's names; a missing name's b is 0); None: b = 0 everywhere
            (a constant correction's b everywhere else).
    """

    rate: float = 0.0
    anchor: Mapping[str, torch.Tensor] | None = None
    offset: Mapping[str, torch.Tensor] | None = None

    def gradient(self, params: dict[str, torch.Tensor], global_theta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """g(w) for the parameters ``params`` (the current weights), by name; names with no term are left out."""
        anchor = self.anchor if self.anchor is not None else global_theta
        offset = self.offset or {}
        out: dict[str, torch.Tensor] = {}
        for n, p in params.items():
            terms = []
            if self.rate != 0.0:
                terms.append(self.rate * (p - anchor[n].to(p.dtype)))
            if n in offset:
                terms.append(offset[n].to(p.dtype))
            if terms:
                out[n] = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        return out


class ClientObjective:
    """Base class: no term, no state (local training unchanged). Subclasses override the hooks they use and say so
    in :attr:`per_example` / :attr:`weight_only` / :attr:`affine` (the trainer asks these before choosing a path)."""

    #: a short name, used in the vectorised executor's reason for training the client one at a time
    name: ClassVar[str] = "objective"
    #: :meth:`per_example_term` returns a term (so DP-SGD computes per-sample gradients of loss + term)
    per_example: ClassVar[bool] = False
    #: :meth:`weight_term` returns a correction
    weight_only: ClassVar[bool] = False
    #: with :attr:`weight_only`: the correction is :meth:`affine_term`'s (the default :meth:`weight_term` computes it),
    #: so the vectorised executor can add it in its closed form
    affine: ClassVar[bool] = False
    #: :meth:`unknown_labels` chooses labels to train on as unknown (a label-masked model family's training)
    masks_labels: ClassVar[bool] = False
    #: with :attr:`masks_labels`: the family's random label mask is kept, the chosen labels added to it (else only the
    #: chosen labels are unknown)
    random_label_mask: bool = True

    def begin(self, ctx: ObjectiveContext) -> None:
        """Before the client's first step (read the client's state into ``ctx.scratch``)."""

    def per_example_term(self, represent: Represent, x: torch.Tensor, y: torch.Tensor, ctx: ObjectiveContext) -> torch.Tensor:
        """(b,) the term of each example of the batch ``x`` (labels ``y``), added to its loss."""
        raise NotImplementedError

    def weight_term(self, params: dict[str, torch.Tensor], ctx: ObjectiveContext) -> dict[str, torch.Tensor]:
        """A correction per parameter name (a subset of θ's names), added to the step's gradient; ``params`` are the
        current weights (detached). Default: :meth:`affine_term`'s gradient (for an objective that declares
        :attr:`affine`)."""
        if not self.affine:
            raise NotImplementedError(f"{type(self).__name__}: weight_only without weight_term (or affine and affine_term)")
        term = self.affine_term(ctx)
        return term.gradient(params, ctx.global_theta) if term is not None else {}

    def affine_term(self, ctx: ObjectiveContext) -> AffineTerm | None:
        """With :attr:`affine`: the weight term as g(w) = a·(w − w_anchor) + b (:class:`AffineTerm`; None: no term in
        this update), read after :meth:`begin` and constant over the update (the sequential and DP-SGD paths evaluate
        it at each step's weights through :meth:`weight_term`; the vectorised executor adds it in its closed form)."""
        return None

    def unbatched_reason(self) -> str | None:
        """Why the vectorised executor's closed form cannot run this objective (a short reason, reported in the
        summary), or None when it can: no per-example term, no label choice, and a weight term only if affine."""
        if self.per_example:
            return "per-example term"
        if self.masks_labels:
            return "label mask training"
        if self.weight_only and not self.affine:
            return "weight term not declared affine"
        return None

    def unknown_labels(
        self, global_probabilities: Callable[[torch.Tensor], torch.Tensor], ctx: ObjectiveContext
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        """For a label-masked model family: a function of a batch ``x`` giving the (b, C) bool mask of the labels to
        train on as unknown, given ``global_probabilities(x)``, the (b, C) probabilities of the global model the
        client received (fp32, eval mode, every label unknown)."""
        raise NotImplementedError

    def end(self, ctx: ObjectiveContext, theta_delta: dict[str, torch.Tensor]) -> None:
        """After the client's last step, with its update (final − start, dense): update the client's state."""
