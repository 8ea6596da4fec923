"""Algorithms, one module each; :data:`ALGORITHMS` is the registry of their classes by name.

Importing the package is light: the parameters models and capabilities (:mod:`secure_fed.algorithms.params`,
:mod:`secure_fed.algorithms.capabilities`, :mod:`secure_fed.algorithms.registry`) are read by ``secure-fed validate``
without torch. The heavy names below (:data:`ALGORITHMS`, :class:`Algorithm`, …) are imported on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALGORITHMS", "Algorithm", "ClientData", "SetupContext"]


def __getattr__(name: str) -> Any:
    if name == "ALGORITHMS":
        from secure_fed.algorithms.registry import algorithm_specs

        return {n: spec.load() for n, spec in algorithm_specs().items()}
    if name in ("Algorithm", "ClientData", "SetupContext"):
        from secure_fed.algorithms import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
