"""The algorithm's parameters, capabilities and registration (``secure_fed.algorithms``: ``topk_fedavg``). Light."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.plugin_api import AlgorithmCapabilities, AlgorithmParams, AlgorithmSpec


class TopKFedAvgParams(AlgorithmParams):
    """``algorithm.name: topk_fedavg``: ``density``, the fraction of the update's entries a client sends (the largest
    in magnitude); 1 is FedAvg. Other keys are refused (the base model forbids them)."""

    #: as FedAvg: clients train θ and their own rows and send both; client-level DP (privacy.client: the sparsified
    #: update is clipped and noised like any other) and DP-SGD in client training (privacy.local: the sparsification
    #: is post-processing of the private training) cover what it releases; it has no server step over label sets
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(dp_units=frozenset({"client", "local"}))
    name: Literal["topk_fedavg"] = "topk_fedavg"
    density: float = Field(0.1, gt=0.0, le=1.0, description="fraction of the update's entries each client sends")


TOPK_FEDAVG = AlgorithmSpec(
    TopKFedAvgParams,
    "topk_fedavg.algorithm:TopKFedAvg",
    "FedAvg whose clients send only the top-k entries (by magnitude) of their update (example plugin)",
)
