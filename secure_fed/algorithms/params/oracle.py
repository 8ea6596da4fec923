"""The centralised baselines' parameters and registration (:mod:`secure_fed.algorithms.oracle`)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.algorithms.capabilities import DP_UNITS, AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec

#: the one DP unit a central trainer takes: DP-SGD in its training (the ``privacy.local`` block), central DP-SGD
CENTRAL_DP = DP_UNITS - {"instance", "client"}


class CentralisedParams(AlgorithmParams):
    """``algorithm.name: centralised``: all training data on one trainer (the general setting's upper bound)."""

    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(
        centralised=True, dp_units=frozenset(), setting="general"
    )
    name: Literal["centralised"] = "centralised"
    validation_fraction: float = Field(
        0.1, ge=0.0, lt=0.9,
        description="centralised baselines (oracle): share of the training data held out to select the epoch whose "
        "model is reported (0: report the last epoch)",
    )  # fmt: skip


class OracleParams(CentralisedParams):
    """``algorithm.name: oracle``: centralised training with all labels and negatives (the upper bound)."""

    #: under ``dp``, DP-SGD on the one trainer (``privacy.local``) is central DP-SGD: the central DP reference
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(centralised=True, dp_units=CENTRAL_DP)
    name: Literal["oracle"] = "oracle"  # type: ignore[assignment]
    oracle_loss: Literal["softmax", "contrastive"] = "softmax"


ORACLE = AlgorithmSpec(
    OracleParams,
    "secure_fed.algorithms.oracle:Oracle",
    "centralised training with all labels and negatives (upper bound)",
)
CENTRALISED = AlgorithmSpec(
    CentralisedParams,
    "secure_fed.algorithms.oracle:Centralised",
    "all training data on one trainer, evaluated on each client's test data (general setting's upper bound)",
)
