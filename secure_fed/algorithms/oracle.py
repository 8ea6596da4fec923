"""The centralised oracle: the upper bound.

One "client" holds all training data with full label vectors and trains θ and
all of W with a loss that sees negatives (softmax cross-entropy over scaled
cosines by default, or FedAwS eq. 12's contrastive loss). Each round is
``training.local_epochs`` epochs of ordinary centralised training.
"""

from __future__ import annotations

from secure_fed.algorithms.base import Algorithm
from secure_fed.algorithms.params.oracle import CentralisedParams, OracleParams


class Oracle(Algorithm):
    params = OracleParams

    @property
    def default_loss(self) -> str:  # type: ignore[override]
        return self.cfg.oracle_loss


class Centralised(Oracle):
    """All training data on one trainer, scored like the federated runs (GmAP on each client's test data): the
    upper bound of the general multi-label setting (the FLAG paper's TResNet (G)). Its loss is the model family's
    (BCE for ``linear_head``) or ``algorithm.loss``, as for the federated methods it is compared with."""

    params = CentralisedParams
    default_loss = "bce"
