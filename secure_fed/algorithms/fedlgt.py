"""FedC-Tran and FedLGT (the FedLGT paper, AAAI 2024, §3; Algorithm 1).

* ``fedctran``: C-Tran (``model.family: ctran``, :mod:`secure_fed.models.ctran`) trained with FedAvg, every
  parameter aggregated; local training is C-Tran's label mask training. The paper's FedC-Tran baseline.
* ``fedlgt``: FedC-Tran plus
  - **ULE** (``algorithm.ule``): the label and state embeddings are frozen text-encoder embeddings of
    ``model.label_prompt`` per label and of "positive"/"negative", through one trained linear map. They are
    buffers of the client's model, computed from the public label names (and cached per encoder, prompt and
    names in the run directory), never in θ, so no uplink carries them and the server never averages them.
  - **CA-MLE** (``algorithm.ca_mle``, eq. 4): in each local step the global model the client received scores
    every sample of the batch; labels with τ − ε ≤ p ≤ τ + ε become unknown (trained on), the others keep their
    label-mask state (:class:`CaMle`, the client objective's :meth:`unknown_labels` hook). The server sends τ and ε;
    the global model is the θ already in the payload, so CA-MLE adds no message.

    **Two readings of CA-MLE.** The paper says the other labels keep their state s_c, and also that FedLGT does
    "not perform training by randomly generated masks"; the authors' code keeps C-Tran's random mask and adds the
    uncertain labels to it. ``algorithm.ca_mle_random_mask: true`` (the default) keeps the random label mask and
    adds the uncertain labels; ``false`` drops the random mask, so only uncertain labels are unknown and trained on.

  With both switches off ``fedlgt`` is ``fedctran``; the Table 4 ablations are ``ule``/``ca_mle`` on or off.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from secure_fed.algorithms.base import ClientData, Payload
from secure_fed.algorithms.fedavg import FedAvg
from secure_fed.algorithms.objective import ClientObjective, ObjectiveContext
from secure_fed.algorithms.params.fedlgt import FedCTranParams, FedLGTParams
from secure_fed.messages import Number, Setting


class CaMle(ClientObjective):
    """CA-MLE (eq. 4) as the client objective's label hook: the labels whose global probability p has
    |p − τ| ≤ ε are trained on as unknown, with (``random_mask``) or without C-Tran's random label mask."""

    name = "ca_mle"
    masks_labels = True

    def __init__(self, tau: float, epsilon: float, random_mask: bool = True):
        self.tau, self.epsilon, self.random_label_mask = float(tau), float(epsilon), bool(random_mask)

    def unknown_labels(
        self, global_probabilities: Callable[[torch.Tensor], torch.Tensor], ctx: ObjectiveContext | None
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        from secure_fed.models.ctran import ca_mle_unknown

        return lambda x: ca_mle_unknown(global_probabilities(x), self.tau, self.epsilon)


class FedCTran(FedAvg):
    params = FedCTranParams
    default_loss = "bce"


class FedLGT(FedCTran):
    params = FedLGTParams
    #: CA-MLE's τ and ε (public settings); sent only when ``algorithm.ca_mle`` is on
    downlink_rules = {
        **FedCTran.downlink_rules, "ca_mle_tau": Number(), "ca_mle_epsilon": Number(), "ca_mle_random_mask": Setting(),
    }  # fmt: skip

    def downlink(self, theta, W, known_labels) -> Payload:
        payload = super().downlink(theta, W, known_labels)
        if self.cfg.ca_mle:
            payload.update(
                ca_mle_tau=float(self.cfg.ca_mle_tau),
                ca_mle_epsilon=float(self.cfg.ca_mle_epsilon),
                ca_mle_random_mask=bool(self.cfg.ca_mle_random_mask),
            )
        return payload

    def client_objective(self, payload: Payload, data: ClientData) -> ClientObjective | None:
        """Client side: CA-MLE from the τ and ε the server sent (when ``algorithm.ca_mle`` is on)."""
        if "ca_mle_tau" not in payload:
            return None
        return CaMle(payload["ca_mle_tau"], payload["ca_mle_epsilon"], payload.get("ca_mle_random_mask", True))
