"""Privacy and security protocol layers that wrap any algorithm.

========================  ====================================================
``keyed_hashing``         HMAC run-key tokens and label pseudonyms (FedALC's label-set collection)
``dp``                    client-level DP-FedAvg and instance-level DP-SGD on W, Opacus accountant, budget
``secure_aggregation``    Bonawitz et al. secure sum on a SecAgg+ graph, with dropout recovery
``ckks``                  CKKS-encrypted aggregation (TenSEAL); the server holds a public context only
========================  ====================================================

List them in YAML under ``protocols:``, innermost (client side) first; see
:mod:`protocols.base` for the interface and :func:`validate_stack` for which
combinations are rejected and why.
"""

from __future__ import annotations

from typing import Any

from protocols.base import ProtocolLayer, ProtocolSetup, StackEnv
from protocols.ckks import CKKSAggregation
from protocols.dp.layer import DifferentialPrivacy
from protocols.keyed_hashing import KeyedHashing
from protocols.secagg.layer import SecureAggregation
from secure_fed.engine.aggregation import RoundSession
from secure_fed.errors import unknown_name

#: Registered layers by name.
LAYERS: dict[str, type[ProtocolLayer]] = {
    cls.name: cls for cls in (KeyedHashing, DifferentialPrivacy, SecureAggregation, CKKSAggregation)
}


def validate_stack(cfg) -> None:
    """Raise ``ValueError`` (shown as a one-line config error) for an invalid ``protocols:`` list."""
    stack = list(cfg.protocols)
    for name in stack:
        if name not in LAYERS:
            raise ValueError(unknown_name("protocol layer", name, LAYERS))
    dup = {n for n in stack if stack.count(n) > 1}
    if dup:
        raise ValueError(f"protocol layer(s) {sorted(dup)} listed twice")
    if stack and cfg.algorithm.name == "oracle":
        raise ValueError("the oracle is the non-private centralised upper bound with one client; protocol layers do not apply")
    summing = [n for n in stack if LAYERS[n].replaces_aggregation]
    if len(summing) > 1:
        raise ValueError(f"{' and '.join(summing)} both replace how the server sums updates; choose one")
    if summing and "dp" in stack and stack.index("dp") > stack.index(summing[0]):
        raise ValueError(f"'dp' must come before '{summing[0]}' in protocols: clients clip before they encode for it")
    for name in stack:
        LAYERS[name].validate(cfg, stack)
    if cfg.privacy.instance is not None or cfg.privacy.client is not None:
        if "dp" not in stack:
            raise ValueError("privacy.instance / privacy.client is set but 'dp' is not listed in protocols")


class ProtocolStack:
    """The configured layers, composed in list order."""

    def __init__(self, cfg, env: StackEnv):
        self.layers: list[ProtocolLayer] = [LAYERS[n](cfg, env) for n in cfg.protocols]

    def __bool__(self) -> bool:
        return bool(self.layers)

    def setup(self, ctx: ProtocolSetup) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        for layer in self.layers:
            facts.update(layer.setup(ctx))
        return facts

    def wrap_query(self, query):
        for layer in self.layers:
            query = layer.wrap_query(query)
        return query

    def wrap_algorithm(self, algorithm) -> None:
        for layer in self.layers:
            layer.wrap_algorithm(algorithm)

    def client_mod(self, fn):
        for layer in self.layers:
            fn = layer.client_mod(fn)
        return fn

    def open_round(self, round_idx: int, base: RoundSession) -> RoundSession:
        session = base
        for layer in self.layers:
            session = layer.open_round(round_idx, session)
        return session

    def budget_stop(self, round_idx: int) -> str | None:
        for layer in self.layers:
            if why := layer.budget_stop(round_idx):
                return why
        return None

    def cohort_uniforms(self, round_idx: int, num_clients: int):
        for layer in self.layers:
            u = layer.cohort_uniforms(round_idx, num_clients)
            if u is not None:
                return u
        return None

    def privacy(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for layer in self.layers:
            out.update(layer.privacy())
        return out

    def private_report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for layer in self.layers:
            out.update(layer.private_report())
        return out

    def round_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for layer in self.layers:
            out.update(layer.round_stats())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {layer.name: layer.state_dict() for layer in self.layers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_state_dict(state.get(layer.name, {}))

    def client_state_dict(self) -> dict[str, Any]:
        return {layer.name: layer.client_state_dict() for layer in self.layers}

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_client_state_dict(state.get(layer.name, {}))

    def secret_state_dict(self) -> dict[str, Any]:
        return {layer.name: layer.secret_state_dict() for layer in self.layers}

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        for layer in self.layers:
            layer.load_secret_state_dict(state.get(layer.name, {}))


__all__ = ["LAYERS", "ProtocolLayer", "ProtocolSetup", "ProtocolStack", "StackEnv", "validate_stack"]
