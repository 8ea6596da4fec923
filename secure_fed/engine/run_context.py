"""What a callback may read of a run: :class:`RunContext`, a frozen record of the run's parts.

Callbacks (evaluation, the privacy record, metrics files, checkpoints, the summaries, plugins' taps) get a
context at every hook, never the run object: its public facts (the run's plan, the run directory, the device, the
dataset, the federation's clients), and handles on the state they read or save: the model state, the records,
the protocol stack (its privacy report and its parties' state), the row order, the guard's message log, the
executor and the run's callbacks. The run object builds a fresh context for each hook, so that a part it
replaces (the executor a back end passes in) is the one the callbacks see.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from secure_fed.engine.execution import Executor
from secure_fed.engine.guard import MessageGuard
from secure_fed.engine.layers import ProtocolStack
from secure_fed.engine.model_state import ModelState
from secure_fed.engine.row_order import RowOrder
from secure_fed.engine.run_records import RunRecords
from secure_fed.plan import RunPlan


@dataclass(frozen=True)
class RunContext:
    """A run's parts as its callbacks see them."""

    plan: RunPlan  #: the run's settings, resolved (:mod:`secure_fed.plan`)
    run_dir: Path
    device: torch.device
    dataset: Any  #: the :class:`~secure_fed.data.MultiLabelDataset` (its public description; the simulator's data)
    fed: Any  #: the :class:`~secure_fed.engine.builders.Federation`: the clients' data, the test split
    algorithm: Any  #: the :class:`~secure_fed.algorithms.Algorithm`
    stack: ProtocolStack  #: the protocol layers: their privacy report, their parties' state
    model: ModelState
    records: RunRecords
    row_order: RowOrder
    guard: MessageGuard
    executor: Executor
    #: every wire message of the run (``output.log_messages``), else None
    messages: list[dict[str, Any]] | None
    #: the run's callbacks (built-in, registered, checkpoint, report), in the order the run calls them
    callbacks: tuple[Any, ...]

    @property
    def round(self) -> int:
        """Rounds completed so far."""
        return self.records.round

    @property
    def theta(self) -> dict[str, torch.Tensor]:
        return self.model.theta

    @property
    def W(self) -> torch.Tensor | None:
        return self.model.W

    @property
    def label_perm(self) -> np.ndarray | None:
        """The simulator's view of the row order: label l lives in row ``label_perm[l]`` (None: the identity)."""
        return self.row_order.perm

    def callback(self, name: str) -> Any:
        """The callback registered under ``name`` in this run, if any."""
        return next((cb for cb in self.callbacks if cb.name == name), None)

    def privacy_summary(self) -> dict[str, Any]:
        """The privacy report of ``summary.json`` (:func:`~secure_fed.engine.privacy_report.privacy_summary`)."""
        from secure_fed.engine.privacy_report import privacy_summary

        return privacy_summary(self.stack.accounting())
