"""FLAG, Fast Label-Adaptive AGgregation for multi-label federated learning (the FLAG/CMDA paper, §3.3, eq. 2).

FedAvg whose server averages the clients' updates with weights each client computes **locally** from its own
label matrix Y^c (n_c × L):

    w_c = Σ_l (Σ_i y^c_il)^α,        θ ← θ + Σ_c w_c Δθ_c / Σ_c w_c,

α (``algorithm.flag_alpha``) trading label occurrence (α → 1: the client's positive count) against label
distribution width (α = 0: how many labels the client has; a label it never sees adds nothing).

The server tells each client α (downlink ``flag_alpha``); the client's reply carries its weight (uplink
``weight``), which the round's aggregation uses as the client's weight
(:func:`secure_fed.engine.aggregation.client_weight`). Secure-sum layers pack it into the summed vector
beside w·Δθ (:class:`~secure_fed.engine.aggregation.UpdateLayout`), so under ``secure_aggregation`` or ``ckks``
the server learns Σ_c w_c Δθ_c and Σ_c w_c, never one client's weight, within a round. A client's w_c is the same
every round, so sums over cohorts that differ (``training.client_fraction`` < 1, dropouts) can be solved for each
w_c, as for ``training.aggregation: num_examples``. Under client-level DP the weight, which has no bound, needs a
public cap (``privacy.client.weight_cap``, W̄): the client scales its clipped update by min(w_c, W̄)/W̄ and reports
weight 1 (:func:`protocols.dp.client_dp.cap_weight`), so the sensitivity stays the clip norm.
"""

from __future__ import annotations

import torch

from secure_fed.algorithms.base import ClientData, Payload, TrainFn
from secure_fed.algorithms.fedavg import FedAvg
from secure_fed.algorithms.params.flag import FLAGParams
from secure_fed.messages import Number


def label_weight(pos: torch.Tensor, alpha: float) -> float:
    """FLAG eq. 2 for one client: Σ_l (Σ_i y_il)^α over the labels present in ``pos`` ((n, k) bool, the client's
    own label matrix). Labels with no positive add nothing, also at α = 0 (where 0^0 would otherwise count them)."""
    counts = pos.to(torch.float64).sum(dim=0)
    counts = counts[counts > 0]
    return float(counts.pow(alpha).sum())


class FLAG(FedAvg):
    params = FLAGParams
    #: the server sends α; the client replies with its eq. 2 weight, which aggregation uses as the client's weight
    downlink_rules = {**FedAvg.downlink_rules, "flag_alpha": Number()}
    uplink_rules = {**FedAvg.uplink_rules, "weight": Number()}

    def downlink(self, theta, W, known_labels) -> Payload:
        return {**super().downlink(theta, W, known_labels), "flag_alpha": float(self.cfg.flag_alpha)}

    def client_update(self, payload: Payload, data: ClientData, train: TrainFn) -> Payload:
        """Client side: local training, then the client's own eq. 2 weight from its own label matrix."""
        return {**train(payload), "weight": label_weight(data.pos, float(payload["flag_alpha"]))}
