"""A run's records: the round counter, the released and private per-round lines, how the run stopped, and its clock.

One mutable object the run object, its callbacks (through the :class:`~secure_fed.engine.run_context.RunContext`)
and its checkpoint share: what the run has done so far, as the server knows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunRecords:
    """What the run has done so far (saved in the server's checkpoint)."""

    round: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)  #: released: one line of metrics.jsonl per round
    diagnostics: list[dict[str, Any]] = field(default_factory=list)  #: private: private/diagnostics.jsonl's lines
    rounds_aborted: int = 0  #: rounds a protocol aborted (nothing applied; a DP layer still charges them)
    stop_reason: str | None = None
    #: what the algorithm's and the layers' setup learned (None: setup has not run)
    setup_facts: dict[str, Any] | None = None
    #: centralised baselines: the epoch reported at the end (set by the evaluation callback), else None
    selected: dict[str, Any] | None = None
    #: on Flower: a public token naming this run to the nodes, under which each keeps its clients' state on its own
    #: storage (kept in the checkpoint, so a resumed run finds the nodes' state again)
    flower_session: str | None = None
    #: the torch threads this stretch of training runs with (secure_fed.threads.threads_record; not checkpointed: a
    #: resumed run picks them again on its machine)
    threads: dict[str, Any] | None = None
    wall_before: float = 0.0  #: wall seconds of training in earlier stretches (before a resume, or a checkpoint)
    t0: float = field(default_factory=time.perf_counter)  #: wall clock at the start of the current stretch

    def elapsed(self) -> float:
        """Wall seconds of training so far, across resumes."""
        return self.wall_before + time.perf_counter() - self.t0

    def restart_clock(self) -> None:
        """Start a new stretch of training (the time before it stays in ``wall_before``)."""
        self.t0 = time.perf_counter()

    def bank_time(self) -> None:
        """Move the current stretch's time into ``wall_before`` (before a checkpoint saves it)."""
        self.wall_before = self.elapsed()
        self.restart_clock()
