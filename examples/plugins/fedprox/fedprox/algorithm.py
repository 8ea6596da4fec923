"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Algorithm 2).

Each client minimises h(θ) = F_k(θ) + μ/2·‖θ − θ_global‖² from the global model it received; the server averages
as FedAvg. The term depends on the weights and the global model only, so it is a weight term of the client objective
(:class:`~secure_fed.plugin_api.ClientObjective`): its gradient μ(θ − θ_global) is added to each step's gradient, and
under DP-SGD after the noise (it reads no example: post-processing). With μ = 0 it is FedAvg.
"""

from __future__ import annotations

import torch

from fedprox.params import FedProxParams
from secure_fed.plugin_api import Algorithm, ClientData, ClientObjective, ObjectiveContext, Payload


class ProximalTerm(ClientObjective):
    """∇ μ/2·‖θ − θ_global‖² = μ(θ − θ_global), per parameter."""

    name = "fedprox"
    weight_only = True

    def __init__(self, mu: float):
        self.mu = float(mu)

    def weight_term(self, params: dict[str, torch.Tensor], ctx: ObjectiveContext) -> dict[str, torch.Tensor]:
        return {n: self.mu * (p - ctx.global_theta[n]) for n, p in params.items()}


class FedProx(Algorithm):
    params = FedProxParams

    def client_objective(self, payload: Payload, data: ClientData) -> ClientObjective:
        return ProximalTerm(self.cfg.mu)
