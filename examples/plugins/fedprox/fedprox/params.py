"""FedProx's parameters, capabilities and registration (``secure_fed.algorithms``: ``fedprox``). Light."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.plugin_api import AlgorithmCapabilities, AlgorithmParams, AlgorithmSpec


class FedProxParams(AlgorithmParams):
    """``algorithm.name: fedprox``: ``mu``, the weight μ of the proximal term μ/2·‖θ − θ_global‖² in each client's
    objective; 0 is FedAvg."""

    #: as FedAvg: the update is what the layers clip and noise (client level), and under DP-SGD (local) the proximal
    #: term's gradient μ(θ − θ_global) reads no example, so it is added after the noise (post-processing)
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(dp_units=frozenset({"client", "local"}))
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0.0, le=1e4, description="weight μ of the proximal term μ/2·‖θ − θ_global‖²")


FEDPROX = AlgorithmSpec(
    FedProxParams,
    "fedprox.algorithm:FedProx",
    "FedAvg with the proximal term μ/2·‖θ − θ_global‖² in each client's objective (Li et al. 2020; example plugin)",
)
