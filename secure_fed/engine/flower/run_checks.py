"""What the Flower back end checks of a run before it starts, from the run's
:class:`~secure_fed.engine.run_context.RunContext`: callbacks inside the clients' code that it does not carry, and
the state the clients keep on the nodes."""

from __future__ import annotations

from secure_fed.engine.run_context import RunContext
from secure_fed.errors import SecureFedError


def client_side_callbacks(ctx: RunContext) -> list[str]:
    """Callbacks that act inside the clients' code and are not carried to Flower nodes (a callback is carried when
    it says so: :meth:`~secure_fed.engine.callbacks.Callback.reports_from_remote_clients`)."""
    return [cb.name for cb in ctx.callbacks if cb.acts_on_clients() and not cb.reports_from_remote_clients()]


def node_held_state(ctx: RunContext) -> list[str]:
    """What keeps client secrets or models on the Flower nodes in this run (layers' client state, an algorithm's
    per-client state): a resumed run needs every node to take it up again from its storage."""
    held = [layer.name for layer in ctx.stack.layers if layer.client_state_on_nodes]
    if ctx.algorithm.keeps_client_state:
        held.append(f"algorithm {ctx.algorithm.name}")
    return held


def check_flower_start(ctx: RunContext) -> None:
    """Refuse, before anything starts, what this back end cannot run: callbacks inside clients, and resuming a run
    whose clients keep state on the nodes from a checkpoint that names no node session (nothing to take up)."""
    busy = client_side_callbacks(ctx)
    if busy:
        raise SecureFedError(
            f"backend=flower: {', '.join(busy)} act inside the clients' code, which the Flower back end does not "
            "carry yet; use backend: inprocess"
        )
    held = node_held_state(ctx)
    if ctx.round > 0 and held and ctx.records.flower_session is None:
        raise SecureFedError(
            f"backend=flower: cannot resume at round {ctx.round}: the clients of {', '.join(held)} keep their secrets or "
            "models on the Flower nodes, and this checkpoint names no Flower session under which the nodes stored them "
            "(it predates node storage); start a new run"
        )
