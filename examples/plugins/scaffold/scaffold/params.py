"""SCAFFOLD's parameters, capabilities and registration (``secure_fed.algorithms``: ``scaffold``). Light."""

from __future__ import annotations

from typing import ClassVar, Literal

from secure_fed.plugin_api import AlgorithmCapabilities, AlgorithmParams, AlgorithmSpec


class ScaffoldParams(AlgorithmParams):
    """``algorithm.name: scaffold``: no keys of its own (the local steps and η are ``training``'s)."""

    #: the clients send FedAvg's update and nothing else (their control variates stay on the client; the server's is
    #: derived from the released mean update), so client-level DP and DP-SGD in client training cover its releases;
    #: the correction c − c_i reads no example (under DP-SGD it is added after the noise)
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(dp_units=frozenset({"client", "local"}))
    name: Literal["scaffold"] = "scaffold"


SCAFFOLD = AlgorithmSpec(
    ScaffoldParams,
    "scaffold.algorithm:Scaffold",
    "FedAvg with control variates c − c_i correcting client drift (Karimireddy et al. 2020, option II; example plugin)",
)
