"""MOON's parameters, capabilities and registration (``secure_fed.algorithms``: ``moon``). Light."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.plugin_api import AlgorithmCapabilities, AlgorithmParams, AlgorithmSpec


class MoonParams(AlgorithmParams):
    """``algorithm.name: moon``: ``mu``, the weight μ of the model-contrastive term, and ``temperature`` τ."""

    #: the clients send FedAvg's update; the contrastive term is part of each example's loss (under DP-SGD inside the
    #: per-sample clip), and the previous local model it reads stays on the client
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(dp_units=frozenset({"client", "local"}))
    name: Literal["moon"] = "moon"
    mu: float = Field(1.0, ge=0.0, le=1e4, description="weight μ of the model-contrastive term")
    temperature: float = Field(0.5, gt=0.0, le=1e3, description="temperature τ of the model-contrastive term")


MOON = AlgorithmSpec(
    MoonParams,
    "moon.algorithm:Moon",
    "FedAvg with a model-contrastive term: each example's representation pulled to the global model's, pushed from "
    "the client's previous model's (Li et al. 2021; example plugin)",
)
