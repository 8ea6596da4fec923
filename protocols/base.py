"""The layer interface, re-exported from the core (:mod:`secure_fed.engine.layers`), where it is defined."""

from secure_fed.engine.layers import AtLeast, ProtocolLayer, ProtocolSetup, ProtocolStack, RoundWrapper, StackEnv

__all__ = ["AtLeast", "ProtocolLayer", "ProtocolSetup", "ProtocolStack", "RoundWrapper", "StackEnv"]
