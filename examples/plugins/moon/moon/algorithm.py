"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021, eq. 3–4).

Each client adds to each example's loss μ·ℓ_con with

    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )
          = softplus((sim(z, z_prev) − sim(z, z_glob))/τ)

where z is the example's representation under the model being trained, z_glob under the global model the client
received and z_prev under the client's own model of its previous round (its state, never sent; the global model in
its first round), and sim is the cosine. The representation is the model family's encoder output (the paper's
projection head output; here the model as the family runs it). The term is a per-example term of the client objective:
under DP-SGD it is inside each example's clip. It is reported minus log 2, so it is 0 (value and gradient) where the
previous and the global model coincide (a constant shift: the gradient is the paper's).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from moon.params import MoonParams
from secure_fed.plugin_api import Algorithm, ClientData, ClientObjective, ObjectiveContext, Payload, Represent

#: where a client keeps its previous round's model in its own state
STATE_KEY = "moon_previous_theta"


class ModelContrast(ClientObjective):
    """μ·(ℓ_con − log 2) per example; the client's model after this round kept as the next round's previous model."""

    name = "moon"
    per_example = True

    def __init__(self, mu: float, temperature: float):
        self.mu, self.temperature = float(mu), float(temperature)

    def begin(self, ctx: ObjectiveContext) -> None:
        previous = ctx.state.get(STATE_KEY)
        ctx.scratch["previous"] = previous if previous is not None else ctx.global_theta

    def per_example_term(self, represent: Represent, x: torch.Tensor, y: torch.Tensor, ctx: ObjectiveContext) -> torch.Tensor:
        z = represent(x).float()
        z_glob = represent(x, ctx.global_theta).float()
        z_prev = represent(x, ctx.scratch["previous"]).float()
        s_glob = F.cosine_similarity(z, z_glob, dim=-1) / self.temperature
        s_prev = F.cosine_similarity(z, z_prev, dim=-1) / self.temperature
        return self.mu * (F.softplus(s_prev - s_glob) - math.log(2.0))

    def end(self, ctx: ObjectiveContext, theta_delta: dict[str, torch.Tensor]) -> None:
        ctx.state[STATE_KEY] = {n: t + theta_delta[n].to(t.dtype) for n, t in ctx.global_theta.items()}


class Moon(Algorithm):
    params = MoonParams
    keeps_client_state = True

    def client_objective(self, payload: Payload, data: ClientData) -> ClientObjective:
        return ModelContrast(self.cfg.mu, self.cfg.temperature)
