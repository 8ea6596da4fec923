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


def apply_client_plan(reply: Any, plan: list[dict[str, Any]], *, data: Any = None, layers: dict[str, Any] | None = None) -> Any:
    """Client side: the reply after each step of ``plan`` in order; an unregistered step is refused. A step
    ``layer:NAME.METHOD`` runs that layer's :func:`client_side` method in this client's copy of the layers, as
    ``method(reply, data, **args)`` (e.g. secure aggregation's mask, which needs the client's round secrets)."""
    for step in plan:
        args = dict(step)
        op = str(args.pop("op", ""))
        if op.startswith("layer:"):
            reply = _layer_attr(op[6:], layers or {})(reply, data, **args)
            continue
        fn = CLIENT_STEPS.get(op)
        if fn is None:
            raise PermissionError(f"{op!r} is not a registered client step")
        reply = fn(reply, **args)
    return reply


def name_of(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


def client_side(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a protocol layer's method as client-side code a remote client may run by name: a client function
    ``(payload, data) -> reply`` (e.g. a key exchange step), or a *mod* ``(client_fn) -> client_fn`` whose result
    carries :func:`mod_of`. The client runs its own copy of the layer (built from the same config), holding its
    own client-side state."""
    fn.__sf_client_side__ = True
    return fn


def mod_of(wrapped: Callable[..., Any], layer: str, method: str, inner: Callable[..., Any]) -> Callable[..., Any]:
    """Say that ``wrapped`` is ``layer.method(inner)``, so a remote client can rebuild it by name."""
    wrapped.__sf_mod__ = (layer, method, inner)
    return wrapped


def _layer_method(fn: Callable[..., Any]) -> tuple[str, str] | None:
    owner, func = getattr(fn, "__self__", None), getattr(fn, "__func__", None)
    if owner is None or not getattr(func, "__sf_client_side__", False) or not isinstance(getattr(owner, "name", None), str):
        return None
    return owner.name, func.__name__


def registered_name(fn: Callable[..., Any]) -> str:
    """The name a server sends for ``fn``; a clear error when it is not a registered client function.

    Names: ``module:qualname`` (a registered function), ``layer:NAME.METHOD`` (a layer's :func:`client_side`
    method), ``mod:NAME.METHOD|INNER`` (a layer's client-side mod around the function named INNER)."""
    if (mod := getattr(fn, "__sf_mod__", None)) is not None:
        layer, method, inner = mod
        return f"mod:{layer}.{method}|{registered_name(inner)}"
    if (lm := _layer_method(fn)) is not None:
        return f"layer:{lm[0]}.{lm[1]}"
    name = name_of(fn)
    if CLIENT_FUNCTIONS.get(name) is not fn:
        raise ValueError(
            f"{name} is not a registered client function (secure_fed.client_functions.client_function): "
            "a remote client cannot run it"
        )
    return name


def resolve_client_function(name: str, layers: dict[str, Any]) -> Callable[..., Any]:
    """Client side: the function a server's ``name`` stands for, built from this client's own code and its copy of
    the layers (``layers``: name → layer object); anything not registered or not marked client-side is refused."""
    if name.startswith("mod:"):
        head, _, inner = name[4:].partition("|")
        return _layer_attr(head, layers)(resolve_client_function(inner, layers))
    if name.startswith("layer:"):
        return _layer_attr(name[6:], layers)
    fn = CLIENT_FUNCTIONS.get(name)
    if fn is None:
        raise PermissionError(f"{name} is not a registered client function")
    return fn


def _layer_attr(ref: str, layers: dict[str, Any]) -> Callable[..., Any]:
    layer_name, _, method = ref.partition(".")
    layer = layers.get(layer_name)
    fn = getattr(layer, method, None) if layer is not None and not method.startswith("__") else None
    if fn is None or _layer_method(fn) != (layer_name, method):
        raise PermissionError(f"{ref} is not a client-side method of a layer of this run")
    return fn


__all__ = [
    "CLIENT_FUNCTIONS",
    "CLIENT_STEPS",
    "apply_client_plan",
    "client_function",
    "client_side",
    "client_step",
    "mod_of",
    "registered_name",
    "resolve_client_function",
]
