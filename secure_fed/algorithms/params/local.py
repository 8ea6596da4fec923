"""Local training's parameters and registration (:mod:`secure_fed.algorithms.local`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec


class LocalParams(AlgorithmParams):
    """``algorithm.name: local``: no keys of its own; each client trains alone."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(
        trains_rows=False, shares_nothing=True, dp_units=frozenset(), setting="general"
    )
    name: Literal["local"] = "local"


LOCAL = AlgorithmSpec(
    LocalParams,
    "secure_fed.algorithms.local:Local",
    "each client trains its own model alone and shares nothing (general setting's lower reference)",
)
