"""FedAvg and FedAvg-fixed baselines in the positive-only setting.

* **FedAvg**: clients minimise the positive loss only (FedALC eq. 14) over θ and
  their own row w_c; the server averages θ and writes back the rows. Nothing
  stops the rows from collapsing — that is the point of the baseline.
* **FedAvg-fixed** (FedAwS "Baseline-2"): W stays at its spread-out random
  initialisation; clients train θ only.
"""

from __future__ import annotations

from secure_fed.algorithms.base import Algorithm
from secure_fed.algorithms.params.fedavg import FedAvgFixedParams, FedAvgParams


class FedAvg(Algorithm):
    params = FedAvgParams


class FedAvgFixed(Algorithm):
    params = FedAvgFixedParams
