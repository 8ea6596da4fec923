"""Algorithms, one module each; :data:`ALGORITHMS` is the registry by name."""

from secure_fed.algorithms.base import Algorithm, ClientData, SetupContext
from secure_fed.algorithms.fedalc import FedALC, FedALCFixed
from secure_fed.algorithms.fedavg import FedAvg, FedAvgFixed
from secure_fed.algorithms.fedaws import FedAwS
from secure_fed.algorithms.fedlgt import FedCTran, FedLGT
from secure_fed.algorithms.flag import FLAG
from secure_fed.algorithms.local import Local
from secure_fed.algorithms.oracle import Centralised, Oracle

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (FedAvg, FedAvgFixed, FedAwS, FedALC, FedALCFixed, FLAG, Oracle, Local, Centralised, FedCTran, FedLGT)
}

__all__ = ["ALGORITHMS", "Algorithm", "ClientData", "SetupContext"]
