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
#: client-side steps a round's plan may name (``name → step(reply, **args) -> reply``), e.g. DP's clip
CLIENT_STEPS: dict[str, Callable[..., Any]] = {}


def client_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Register ``fn`` (a module-level ``(payload, data) -> reply`` function) under ``module:qualname``."""
    CLIENT_FUNCTIONS[name_of(fn)] = fn
    return fn


def client_step(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a client-side step of a protocol layer under ``name`` (``step(reply, **args) -> reply``).

    A layer's round session describes the steps a client applies to its update this round as a *plan*
    (:meth:`~secure_fed.engine.aggregation.RoundSession.client_plan`): a list of ``{"op": name, **args}`` with
    public arguments only. In process the session's ``client_mod`` runs them; a remote client (``backend: flower``)
    receives the plan with its payload and runs the steps it has under those names, never anything else."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        CLIENT_STEPS[name] = fn
        return fn

    return register


def apply_client_plan(reply: Any, plan: list[dict[str, Any]]) -> Any:
    """Client side: the reply after each step of ``plan`` in order; an unregistered step is refused."""
    for step in plan:
        args = dict(step)
        op = str(args.pop("op", ""))
        fn = CLIENT_STEPS.get(op)
        if fn is None:
            raise PermissionError(f"{op!r} is not a registered client step")
        reply = fn(reply, **args)
    return reply


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


__all__ = ["CLIENT_FUNCTIONS", "CLIENT_STEPS", "apply_client_plan", "client_function", "client_step", "registered_name"]
