"""FedAvg with top-k sparsified client updates (Aji & Heafield 2017; Sattler et al. 2019), without error feedback.

Each client trains as in FedAvg, then keeps the ``k = ⌈density · d⌉`` entries of largest magnitude of its whole
update (Δθ and its row deltas, as one vector of d entries) and zeroes the rest; the server averages as usual. The
only change to FedAvg is :meth:`TopKFedAvg.client_update`, on the client.

Under ``dp`` the sparsified update is what the layers clip, noise and sum: client-level DP covers it like any
update (the noise is added to every entry, so the release is dense), and under DP-SGD in client training the
selection is post-processing of the private training.
"""

from __future__ import annotations

import math

import torch

from secure_fed.plugin_api import Algorithm, ClientData, Payload, TrainFn, dense_delta
from topk_fedavg.params import TopKFedAvgParams


def top_k(reply: Payload, density: float) -> Payload:
    """A copy of ``reply`` with all but the ⌈density · d⌉ largest-magnitude entries of (Δθ, Δrows) set to zero."""
    parts = {f"theta/{n}": dense_delta(t) for n, t in reply["theta_delta"].items()}
    if "rows_delta" in reply:
        parts["rows"] = reply["rows_delta"]
    flat = torch.cat([t.reshape(-1) for t in parts.values()])
    k = max(1, math.ceil(density * flat.numel()))
    keep = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    keep[torch.topk(flat.abs(), k, sorted=False).indices] = True
    out, start = dict(reply), 0
    kept = {}
    for key, t in parts.items():
        kept[key] = t * keep[start : start + t.numel()].view(t.shape).to(t.dtype)
        start += t.numel()
    out["theta_delta"] = {n: kept[f"theta/{n}"] for n in reply["theta_delta"]}
    if "rows_delta" in reply:
        out["rows_delta"] = kept["rows"]
    return out


class TopKFedAvg(Algorithm):
    params = TopKFedAvgParams

    def client_update(self, payload: Payload, data: ClientData, train: TrainFn) -> Payload:
        """Client side: FedAvg's local training, then the update's top-k entries only."""
        return top_k(train(payload), self.cfg.density)
