"""FedAvg's and FedAvg-fixed's parameters and registration (:mod:`secure_fed.algorithms.fedavg`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec


class FedAvgParams(AlgorithmParams):
    """``algorithm.name: fedavg``: no keys of its own."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities()
    name: Literal["fedavg"] = "fedavg"


class FedAvgFixedParams(AlgorithmParams):
    """``algorithm.name: fedavg_fixed``: no keys of its own; W keeps its initialisation."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(has_rows=True, trains_rows=False, fixed_w=True)
    name: Literal["fedavg_fixed"] = "fedavg_fixed"


FEDAVG = AlgorithmSpec(
    FedAvgParams,
    "secure_fed.algorithms.fedavg:FedAvg",
    "positive loss only, clients train θ and their own row; W may collapse",
)
FEDAVG_FIXED = AlgorithmSpec(
    FedAvgFixedParams,
    "secure_fed.algorithms.fedavg:FedAvgFixed",
    "positive loss only, W frozen at its random spread-out initialisation",
)
