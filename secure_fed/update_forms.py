"""Which forms a run's plaintext client updates may take beyond dense tensors: the one statement of the rule.

A *row-sparse* update carries a sparse-input table as the columns the client touched; a *deferred* update (the
vectorised executor's) is formed when read and summed by its group (:mod:`secure_fed.models.group_updates`).
Both need every listed layer to pass plaintext θ updates to the plain sum untouched; a deferred update also
refers to the group that trained it, so nothing outside the engine may hold the wire messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from secure_fed.plan import RunPlan


def deferred_refusal(plan: RunPlan, *, dense_layers: Sequence[str], callbacks: Sequence[str] = ()) -> str | None:
    """Why this run's updates may not be deferred (``training.deferred_updates``), as one line; None when they may.
    ``dense_layers``: the listed layers that take only dense updates; ``callbacks``: the registered callbacks of the
    run (they see the clients' messages)."""
    t = plan.training
    if t.executor != "vectorized" or plan.backend == "flower":
        return ("training.deferred_updates=true: only the vectorized executor, in process, trains groups whose "
                "updates it can defer; set training.executor: vectorized (backend: inprocess) or "
                "training.deferred_updates: auto")  # fmt: skip
    if plan.output.log_messages:
        return ("training.deferred_updates=true: output.log_messages keeps the clients' messages, which must then hold "
                "dense updates; set training.deferred_updates: auto")  # fmt: skip
    if dense_layers:
        return (f"training.deferred_updates=true: protocols {list(dense_layers)} take only dense client updates (they "
                "mask, encrypt, clip or noise each whole update); set training.deferred_updates: auto")  # fmt: skip
    if callbacks:
        return (f"training.deferred_updates=true: callbacks {list(callbacks)} see the clients' messages, which must "
                "then hold dense updates; set training.deferred_updates: auto")  # fmt: skip
    return None


def deferred_updates(plan: RunPlan, *, dense_layers: Sequence[str], callbacks: Sequence[str] = ()) -> bool:
    """Whether this run defers its updates: ``training.deferred_updates`` is not false and nothing refuses it."""
    refusal = deferred_refusal(plan, dense_layers=dense_layers, callbacks=callbacks)
    return plan.training.deferred_updates is not False and refusal is None
