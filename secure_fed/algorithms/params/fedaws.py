"""FedAwS's parameters and registration (:mod:`secure_fed.algorithms.fedaws`)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import MAX_SIZE, AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec
from secure_fed.kernel_sizes import top_k_pair_block_bytes


class RegularizerParams(AlgorithmParams):
    """The keys of a server regulariser on W: its step and its top-k negative mining."""

    lam: float = Field(10.0, ge=0.0, le=1e9, description="λ, the regulariser's learning-rate multiplier")
    reg_lr: float = Field(1e-4, gt=0.0, le=1e6, description="η, server learning rate of the regulariser step")
    k: int = Field(5, ge=1, le=MAX_SIZE, description="negative mining: number of nearest classes per class")
    margin: float = Field(1.0, gt=0.0, le=4.0, description="ν in cosine distance (fedalc eq. 11/12, fedaws eq. 7)")

    def memory_terms(self, embedding_dim: int, shape: Any) -> tuple[dict[str, float], dict[str, float]]:
        """A round adds one block of the top-k regulariser's pair tensors."""
        return {}, {"round": top_k_pair_block_bytes(shape.labels, self.k, embedding_dim)}


class FedAwSParams(RegularizerParams):
    """``algorithm.name: fedaws``: the spreadout regulariser (eq. 7, or eq. 8 with negative mining)."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(has_rows=True)
    name: Literal["fedaws"] = "fedaws"
    negative_mining: bool = Field(True, description="fedaws: eq. 8 (top-k) instead of eq. 7")


FEDAWS = AlgorithmSpec(
    FedAwSParams,
    "secure_fed.algorithms.fedaws:FedAwS",
    "FedAvg + server spreadout regulariser with top-k negative mining (FedAwS eq. 8)",
)
