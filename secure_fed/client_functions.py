"""Named client functions: the client-side code a server may ask a remote client to run by name.

In process, a setup-time exchange (label-set collection, a layer's key exchange) hands the client function itself
to the channel. Across a real network (the Flower back end) a function cannot travel: the server sends its
registered name, and the client runs the function it has under that name, never anything else. Register a
module-level function with :func:`client_function`; a lambda or closure cannot be called remotely.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CLIENT_FUNCTIONS: dict[str, Callable[..., Any]] = {}


def client_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn`` (a module-level ``(payload, data) -> reply`` function) under ``module:qualname``."""
    CLIENT_FUNCTIONS[name_of(fn)] = fn
    return fn


def name_of(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def registered_name(fn: Callable[..., Any]) -> str:
    """The name a server sends for ``fn``; a clear error when it is not a registered client function."""
    name = name_of(fn)
    if CLIENT_FUNCTIONS.get(name) is not fn:
        raise ValueError(
            f"{name} is not a registered client function (secure_fed.client_functions.client_function): "
            "a remote client cannot run it"
        )
    return name


__all__ = ["CLIENT_FUNCTIONS", "client_function", "registered_name"]
