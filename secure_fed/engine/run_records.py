"""A run's records: the round counter, the released and private per-round lines, how the run stopped, and its clock.

One mutable object the run object, its callbacks (through the :class:`~secure_fed.engine.run_context.RunContext`)
and its checkpoint share: what the run has done so far, as the server knows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from secure_fed.release import release_fields, with_infinite_epsilon
from secure_fed.run_files import PRIVACY_RECORD


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
    #: the release gate's findings so far (:func:`secure_fed.release.release_fields`): each makes the run's ε ∞
    release_findings: list[str] = field(default_factory=list)
    wall_before: float = 0.0  #: wall seconds of training in earlier stretches (before a resume, or a checkpoint)
    t0: float = field(default_factory=time.perf_counter)  #: wall clock at the start of the current stretch

    def release(self, tagged: dict[str, Any], file: str, *, into: dict[str, Any] | None = None) -> dict[str, Any]:
        """A released document (``tagged``: field → :class:`~secure_fed.release.Released`) as ``file`` writes it:
        the tags off, every finding kept in :attr:`release_findings`, and, once there is one, the document's privacy
        report (if it has one) at ε = ∞ with the findings as its why. ``into``: a released document (already
        through here) the fields are added to, in place; its report gets the new findings. Strict mode raises on an
        untagged field."""
        before = len(self.release_findings)
        plain, found = release_fields(tagged, file)
        self.release_findings += [x for x in found if x not in self.release_findings]
        doc = plain if into is None else into
        if into is not None:
            into.update(plain)
        new = self.release_findings if into is None else self.release_findings[before:]
        if new and PRIVACY_RECORD in doc:
            doc[PRIVACY_RECORD] = with_infinite_epsilon(doc[PRIVACY_RECORD], new)
        return doc

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
