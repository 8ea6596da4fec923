"""Local training: each client trains its own model alone and never shares it (the FLAG paper's TResNet (L)).

The lower reference of the general multi-label setting: what a client gets without federation. Every client
starts from the same initial θ (the server's round-0 model, sent once per round but used only the first time),
keeps its own θ_c in its client state between rounds, and replies with a zero update, so the server's model never
moves and learns nothing of the clients' data (the pooled test metrics and GmAP are not computed; the run's
figures are AmAP and WmAP: each client's own model on its own test data).
"""

from __future__ import annotations

import torch

from secure_fed.algorithms.base import Algorithm, ClientData, Payload, TrainFn
from secure_fed.algorithms.params.local import LocalParams
from secure_fed.models.sparse_rows import apply_delta


class Local(Algorithm):
    params = LocalParams
    has_global_model = False
    keeps_client_state = True

    def client_update(self, payload: Payload, data: ClientData, train: TrainFn) -> Payload:
        """Train the client's own model one more round; reply with a zero update (nothing leaves the client)."""
        start = data.state.get("theta")
        if start is None:
            start = {n: t.detach().clone() for n, t in payload["theta"].items()}
        reply = train({**payload, "theta": start})
        data.state["theta"] = {n: apply_delta(start[n], reply["theta_delta"][n]) for n in start}
        return {**reply, "theta_delta": {n: torch.zeros_like(start[n]) for n in reply["theta_delta"]}}

    def client_model(self, payload: Payload, data: ClientData, reply: Payload) -> dict[str, torch.Tensor]:
        return data.state["theta"]
