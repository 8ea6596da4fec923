"""Privacy and security protocol layers that wrap any algorithm.

========================  ====================================================
``keyed_hashing``         HMAC run-key tokens and label pseudonyms (FedALC's label-set collection)
``dp``                    client-level DP-FedAvg and instance-level DP-SGD on W, Opacus accountant, budget
``secure_aggregation``    Bonawitz et al. secure sum on a SecAgg+ graph, with dropout recovery
``ckks``                  CKKS-encrypted aggregation (TenSEAL); the server holds a public context only
========================  ====================================================

List them in YAML under ``protocols:``, innermost (client side) first. The core finds them through the
``secure_fed.layers`` entry points, which point at the light specs in :mod:`protocols.layer_specs` (rules,
threat models); the implementations are imported only when a run builds its stack. The interface is
the core's, and every module here imports from secure-fed only through its public plugin API
(:mod:`secure_fed.plugin_api.layers`).

This package imports nothing heavy at import time: ``LAYERS`` (name → layer class) loads on first use.
"""

from __future__ import annotations

from secure_fed.plugin_api.layers import layer_specs


def __getattr__(name: str):
    if name == "LAYERS":
        return {n: spec.load() for n, spec in layer_specs().items()}
    raise AttributeError(name)


__all__ = ["LAYERS"]
