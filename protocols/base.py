"""The layer interface, re-exported from the core (:mod:`secure_fed.engine.layers`), where it is defined."""

from secure_fed.engine.layers import Bounds, ProtocolLayer, ProtocolSetup, ProtocolStack, RoundWrapper, StackEnv

__all__ = ["Bounds", "ProtocolLayer", "ProtocolSetup", "ProtocolStack", "RoundWrapper", "StackEnv"]
