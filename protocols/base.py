"""The layer interface, re-exported from the core (:mod:`secure_fed.engine.layers`), where it is defined."""

from secure_fed.engine.layers import ProtocolLayer, ProtocolSetup, ProtocolStack, RoundWrapper, StackEnv

__all__ = ["ProtocolLayer", "ProtocolSetup", "ProtocolStack", "RoundWrapper", "StackEnv"]
