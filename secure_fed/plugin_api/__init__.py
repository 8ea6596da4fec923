"""The public API for third-party algorithms: everything a plugin package imports from secure-fed, in one module.

An algorithm plugin (see ``examples/plugins/``) registers an :class:`AlgorithmSpec` under the entry-point group
``secure_fed.algorithms``; its parameters model subclasses :class:`AlgorithmParams` and declares
:class:`AlgorithmCapabilities`; its implementation subclasses :class:`Algorithm` and may add to the clients' local
training through a :class:`ClientObjective` (:meth:`Algorithm.client_objective`; a weight term affine in the
weights declared as an :class:`AffineTerm`, which the vectorised executor adds in its closed form).

Light names (the parameters side: pydantic and the standard library) import at once, so ``secure-fed validate``
does not load torch; the training side (:class:`Algorithm`, :class:`ClientObjective`, …) is imported when first
read.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec
from secure_fed.messages import Number, Params, Setting

if TYPE_CHECKING:
    from secure_fed.algorithms.base import Algorithm, ClientData, Payload, SetupContext, TrainFn
    from secure_fed.algorithms.objective import AffineTerm, ClientObjective, ObjectiveContext, Represent
    from secure_fed.models.sparse_rows import apply_delta, dense_delta

#: the training side, by name: the module each is read from on first use (torch)
_LAZY = {
    "Algorithm": "secure_fed.algorithms.base",
    "ClientData": "secure_fed.algorithms.base",
    "Payload": "secure_fed.algorithms.base",
    "SetupContext": "secure_fed.algorithms.base",
    "TrainFn": "secure_fed.algorithms.base",
    "AffineTerm": "secure_fed.algorithms.objective",
    "ClientObjective": "secure_fed.algorithms.objective",
    "ObjectiveContext": "secure_fed.algorithms.objective",
    "Represent": "secure_fed.algorithms.objective",
    "apply_delta": "secure_fed.models.sparse_rows",
    "dense_delta": "secure_fed.models.sparse_rows",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AlgorithmCapabilities",
    "AlgorithmParams",
    "AlgorithmSpec",
    "Number",
    "Params",
    "Setting",
    "Algorithm",
    "ClientData",
    "Payload",
    "SetupContext",
    "TrainFn",
    "AffineTerm",
    "ClientObjective",
    "ObjectiveContext",
    "Represent",
    "apply_delta",
    "dense_delta",
]
