"""FedC-Tran's and FedLGT's parameters and registration (:mod:`secure_fed.algorithms.fedlgt`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec

#: both train C-Tran, a baseline of the general multi-label setting
_CTRAN = AlgorithmCapabilities(setting="general", requires_family="ctran")


class FedCTranParams(AlgorithmParams):
    """``algorithm.name: fedctran``: no keys of its own."""

    capabilities: ClassVar[AlgorithmCapabilities] = _CTRAN
    name: Literal["fedctran"] = "fedctran"


class FedLGTParams(AlgorithmParams):
    """``algorithm.name: fedlgt``: FedC-Tran plus ULE and CA-MLE."""

    capabilities: ClassVar[AlgorithmCapabilities] = _CTRAN
    name: Literal["fedlgt"] = "fedlgt"
    ule: bool = Field(True, description="fedlgt: universal label embeddings from the text encoder (FedLGT §3.3)")
    ca_mle: bool = Field(True, description="fedlgt: client-aware masked label embedding (FedLGT eq. 4)")
    ca_mle_random_mask: bool = Field(
        True,
        description="fedlgt: CA-MLE's uncertain labels join C-Tran's random label mask (true, as the authors' code) or "
        "replace it, every other label given with its true state (false, the paper's §3.3 wording)",
    )
    ca_mle_tau: float = Field(0.5, gt=0.0, lt=1.0, description="fedlgt: τ of CA-MLE")
    ca_mle_epsilon: float = Field(
        0.02, ge=0.0, lt=0.5, description="fedlgt: ε of CA-MLE (labels with |p − τ| ≤ ε become unknown)"
    )

    @property
    def uses_text_encoder(self) -> bool:
        """ULE's label embeddings come from the text encoder's weights (on disk)."""
        return self.ule


FEDCTRAN = AlgorithmSpec(
    FedCTranParams,
    "secure_fed.algorithms.fedlgt:FedCTran",
    "C-Tran (model.family: ctran) trained with FedAvg and label mask training (FedLGT's FedC-Tran baseline)",
)
FEDLGT = AlgorithmSpec(
    FedLGTParams,
    "secure_fed.algorithms.fedlgt:FedLGT",
    "FedC-Tran + universal label embeddings from a text encoder + CA-MLE (FedLGT eq. 4)",
)
