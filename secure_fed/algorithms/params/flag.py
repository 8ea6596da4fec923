"""FLAG's parameters and registration (:mod:`secure_fed.algorithms.flag`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec


class FLAGParams(AlgorithmParams):
    """``algorithm.name: flag``: FedAvg weighted by each client's eq. 2 weight, which the client reports."""

    #: the reported weight is computed from the client's labels outside DP-SGD: only client-level DP (with a weight cap)
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(sends_weights=True, dp_units=frozenset({"client"}))
    name: Literal["flag"] = "flag"
    flag_alpha: float = Field(0.3, ge=0.0, le=10.0, description="flag: α of eq. 2, w_c = Σ_l (client c's positives of label l)^α")


FLAG = AlgorithmSpec(
    FLAGParams,
    "secure_fed.algorithms.flag:FLAG",
    "FedAvg weighted by FLAG eq. 2: each client's w = Σ_l (its positives of label l)^α, computed locally",
)
