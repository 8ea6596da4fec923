"""The public plugin API for protocol layers (protocols/): the stable types and helpers they import from secure-fed.

A name is listed here because a layer needs it; everything else in secure_fed is internal and may change. A layer
package imports from secure-fed only through this module (and :mod:`secure_fed.plugin_api`).

Every name is read from its module on first use (module ``__getattr__``), so importing this module loads nothing
(no torch): a layer's light spec module (rules, threat model, settings builder) imports its names from here and
``secure-fed validate`` stays torch-free, while the layer's implementation pulls the training side when a run builds
its stack. Type checkers see the names through the ``TYPE_CHECKING`` block.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from secure_fed.algorithms.base import Algorithm, ClientData, ClientFn, Payload
    from secure_fed.algorithms.label_sets import canonical_rows
    from secure_fed.algorithms.params.base import AlgorithmParams
    from secure_fed.algorithms.per_sample import GradientPrivatizer
    from secure_fed.algorithms.registry import AlgorithmsWith
    from secure_fed.client_functions import apply_client_plan, client_function, client_side, client_step, mod_of
    from secure_fed.engine.aggregation import Aggregate, RoundSession
    from secure_fed.engine.layers import (
        Bounds,
        ClientSide,
        LayerState,
        Ledger,
        ProtocolLayer,
        ProtocolSetup,
        RoundWrapper,
        SetupResult,
        StackEnv,
        StateScope,
    )
    from secure_fed.engine.message_digest import payload_digest
    from secure_fed.errors import ConfigError, PrivacyViolation, RoundAborted, SecureFedError
    from secure_fed.kernel_sizes import PER_SET_CHUNK_ELEMENTS, per_set_chunk_bytes
    from secure_fed.memory import DataShape
    from secure_fed.messages import ByteList, FullTable, Indices, Number, Opaque, Setting, ShortBytes, Vector
    from secure_fed.models.sparse_rows import dense_delta
    from secure_fed.participation import cyclic_period
    from secure_fed.plan import DatasetPlan, ModelPlan, RunPlan, TrainingPlan
    from secure_fed.plugin_specs import LayerSpec, layer_specs
    from secure_fed.plugins import load_object, registry
    from secure_fed.release import declare_mechanism
    from secure_fed.secret_settings import SECRET

#: each public name → the module it is read from on first use
_LAZY = {
    # --- the run plan: what a spec's callables receive (``plan: RunPlan``) and the parts a layer reads
    "RunPlan": "secure_fed.plan",  # a run's settings, resolved once (plugin sections: ``plan.part(PrivacyConfig)``)
    "TrainingPlan": "secure_fed.plan",  # the plan's ``training`` part (rounds, sampling, cohort_size, …)
    "cyclic_period": "secure_fed.participation",  # P of ``training.sampling: cyclic`` (client c in the rounds r ≡ c mod P)
    "DatasetPlan": "secure_fed.plan",  # the plan's ``dataset`` part (a public size for a divisor, the format)
    "ModelPlan": "secure_fed.plan",  # the plan's ``model`` part (family, embedding_dim, fixed_encoder, …)
    "AlgorithmParams": "secure_fed.algorithms.params.base",  # ``plan.algorithm``: the algorithm's parameters model
    "DataShape": "secure_fed.memory",  # the data's sizes a spec's ``memory(plan, shape, params, device)`` is given
    # --- the layers' spec (what the core sees before a run) and the algorithms' declarations it reads
    "LayerSpec": "secure_fed.plugin_specs",  # a layer's light spec: rules, threat model, settings builder, …
    "layer_specs": "secure_fed.plugin_specs",  # the registered layers' specs, by name
    "AlgorithmsWith": "secure_fed.algorithms.registry",  # the registered algorithms whose capabilities declare a flag
    # --- the layers' base classes and hooks (the stack's interface)
    "ProtocolLayer": "secure_fed.engine.layers",  # a layer's base class: ``Layer(settings, env)`` and its hooks
    "StackEnv": "secure_fed.engine.layers",  # the run's public facts a layer is built with (clients, bound m, rows)
    "ProtocolSetup": "secure_fed.engine.layers",  # what the setup hook is given (the clients' setup exchange)
    "SetupResult": "secure_fed.engine.layers",  # what the setup hook returns
    "ClientSide": "secure_fed.engine.layers",  # the clients' hook: the layer's registered client functions
    "Ledger": "secure_fed.engine.layers",  # the ledger hook: what a layer accounts and reports
    "LayerState": "secure_fed.engine.layers",  # the state hook: a layer's checkpointed state, by scope
    "StateScope": "secure_fed.engine.layers",  # one scope of a layer's state (server, secret, client)
    "RoundWrapper": "secure_fed.engine.layers",  # a round session that wraps the inner one (the open_round hook)
    "Bounds": "secure_fed.engine.layers",  # a plan argument a remote node checks as a range (e.g. a noise share's std)
    "RoundSession": "secure_fed.engine.aggregation",  # a round's aggregation session (the innermost one: the plain sum)
    "Aggregate": "secure_fed.engine.aggregation",  # sums over one round's surviving clients
    # --- the algorithms' side a layer wraps
    "Algorithm": "secure_fed.algorithms.base",  # an algorithm's implementation (the W step a layer privatises)
    "ClientData": "secure_fed.algorithms.base",  # one client's data, as its training sees it
    "ClientFn": "secure_fed.algorithms.base",  # a client function ``(payload, data) -> reply``
    "Payload": "secure_fed.algorithms.base",  # a downlink or uplink message body
    "GradientPrivatizer": "secure_fed.algorithms.per_sample",  # DP-SGD in a client's local training (a dp layer's hook)
    "canonical_rows": "secure_fed.algorithms.label_sets",  # an instance's canonical label-set rows (what is hashed)
    # --- the clients' plan: registered client functions
    "client_side": "secure_fed.client_functions",  # marks a layer's method as client-side code a remote client may run by name
    "client_step": "secure_fed.client_functions",  # registers a client-side step of the clients' plan under a name
    "apply_client_plan": "secure_fed.client_functions",  # client side: a reply after each step of a round's plan
    "mod_of": "secure_fed.client_functions",  # says a wrapped client function is ``layer.method(inner)`` (rebuilt by name)
    "client_function": "secure_fed.client_functions",  # registers a setup exchange's client function (a DP mechanism plugin's)
    # --- the plugin registries (a DP mechanism plugin's entry points, its heavy half by "module:attr")
    "registry": "secure_fed.plugins",  # name → loaded object of a ``secure_fed.<group>`` entry point group
    "load_object": "secure_fed.plugins",  # imports ``"module:attr"``
    # --- update forms & deltas
    "dense_delta": "secure_fed.models.sparse_rows",  # a client update's delta as dense tensors (row-sparse expanded)
    "payload_digest": "secure_fed.engine.message_digest",  # the SHA-256 of a payload (a client retrains only the same)
    # --- secret settings (a field whose value a release leaves out: a seed of DP noise, of the SecAgg graph)
    "SECRET": "secure_fed.secret_settings",  # the marker of a secret config field (``json_schema_extra=SECRET``)
    # --- the guard's message rules (the keys a layer adds to downlinks and uplinks)
    "ByteList": "secure_fed.messages",  # a list of short byte strings (instance tokens, label pseudonyms)
    "FullTable": "secure_fed.messages",  # a tensor added to every row of a table (e.g. a noise share)
    "Indices": "secure_fed.messages",  # distinct sorted indices (which pieces of a split message a client sent)
    "Number": "secure_fed.messages",  # one number
    "Opaque": "secure_fed.messages",  # a value the guard does not inspect (a layer's own protocol message)
    "Setting": "secure_fed.messages",  # a flag or a name: public configuration
    "ShortBytes": "secure_fed.messages",  # one short byte string (a public key, a signature)
    "Vector": "secure_fed.messages",  # a finite 1-D float tensor (a per-label statistic a DP mechanism plugin bounds)
    # --- memory sizes (the W step's per-set chunks)
    "PER_SET_CHUNK_ELEMENTS": "secure_fed.kernel_sizes",  # elements of one chunk of per-set gradients
    "per_set_chunk_bytes": "secure_fed.kernel_sizes",  # the bytes of one chunk of per-set gradients
    # --- errors
    "SecureFedError": "secure_fed.errors",  # the base of errors caused by user input (one line, exit 2)
    "ConfigError": "secure_fed.errors",  # a setting that cannot run: one line, exit 2
    "PrivacyViolation": "secure_fed.errors",  # a message would give a party more than the algorithm allows
    "RoundAborted": "secure_fed.errors",  # a protocol could not complete the round (e.g. too few survivors)
    # --- release writers
    "declare_mechanism": "secure_fed.release",  # declares a DP mechanism's kind, so a released value may be tagged with it
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "RunPlan",
    "TrainingPlan",
    "cyclic_period",
    "DatasetPlan",
    "ModelPlan",
    "AlgorithmParams",
    "DataShape",
    "LayerSpec",
    "layer_specs",
    "AlgorithmsWith",
    "ProtocolLayer",
    "StackEnv",
    "ProtocolSetup",
    "SetupResult",
    "ClientSide",
    "Ledger",
    "LayerState",
    "StateScope",
    "RoundWrapper",
    "Bounds",
    "RoundSession",
    "Aggregate",
    "Algorithm",
    "ClientData",
    "ClientFn",
    "Payload",
    "GradientPrivatizer",
    "canonical_rows",
    "client_side",
    "client_step",
    "apply_client_plan",
    "mod_of",
    "client_function",
    "registry",
    "load_object",
    "dense_delta",
    "payload_digest",
    "SECRET",
    "ByteList",
    "FullTable",
    "Indices",
    "Number",
    "Opaque",
    "Setting",
    "ShortBytes",
    "Vector",
    "PER_SET_CHUNK_ELEMENTS",
    "per_set_chunk_bytes",
    "SecureFedError",
    "ConfigError",
    "PrivacyViolation",
    "RoundAborted",
    "declare_mechanism",
]
