"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, Algorithm 2).

Each client minimises h(θ) = F_k(θ) + μ/2·‖θ − θ_global‖² from the global model it received; the server averages
as FedAvg. The term depends on the weights and the global model only, so it is a weight term of the client objective
(:class:`~secure_fed.plugin_api.ClientObjective`): its gradient μ(θ − θ_global) is added to each step's gradient, and
under DP-SGD after the noise (it reads no example: post-processing). The gradient is affine in θ, so it is declared as
an :class:`~secure_fed.plugin_api.AffineTerm` (rate μ, anchor the global model), which the vectorised executor adds in
its closed form (the clients train together). With μ = 0 it is FedAvg.
"""

from __future__ import annotations

from fedprox.params import FedProxParams
from secure_fed.plugin_api import AffineTerm, Algorithm, ClientData, ClientObjective, ObjectiveContext, Payload


class ProximalTerm(ClientObjective):
    """∇ μ/2·‖θ − θ_global‖² = μ(θ − θ_global), per parameter."""

    name = "fedprox"
    weight_only = True
    affine = True

    def __init__(self, mu: float):
        self.mu = float(mu)

    def affine_term(self, ctx: ObjectiveContext) -> AffineTerm:
        return AffineTerm(rate=self.mu)  # anchor: the global model the client received


class FedProx(Algorithm):
    params = FedProxParams

    def client_objective(self, payload: Payload, data: ClientData) -> ClientObjective:
        return ProximalTerm(self.cfg.mu)
