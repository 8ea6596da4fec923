"""Membership inference's reference (shadow) runs trained as one vectorised cohort.

A shadow run is a federation of its own: the target's recipe on a random half of the target pool. The K shadows'
rounds have the same structure, and their clients' local training is the same kind of request (same model
shapes, settings, loss), so their clients can train as one lock-step group of the vectorised executor
(:func:`secure_fed.algorithms.batched_sgd.train_group` with each client its own θ: a shadow's clients start from
their shadow's θ).

How, without a second engine: each shadow is an ordinary :class:`~secure_fed.engine.Experiment` (its own seed,
data, server state, DP layer and run directory), run whole by ``run_rounds`` inside its own coroutine (a
``greenlet``, on this thread) with a :class:`CohortExecutor`, the vectorised executor whose training step, instead of
training the chunk's waiting clients itself, hands them to the :class:`ShadowCohort` and pauses. Once every shadow
has paused there (or finished), the cohort trains all the waiting clients of all shadows together, grouped by
:func:`~secure_fed.algorithms.batched_sgd.group_key` with ``own_theta`` (so one group spans the shadows), and
resumes each shadow with its own clients' replies. Everything else a shadow does (sampling, its DP layer's noise
and accounting, aggregation, the server step, evaluation, files) runs in its own coroutine, one shadow after
another, from its own state and seeded generators: a shadow's result is what it would be alone with the vectorised
executor, up to the floating-point reassociation of a batched product (``tests/threat_models/test_shadow_cohort.py``).
Requests the batched trainer does not cover (DP-SGD in client training, momentum, …) run at once in their client's
turn, as on the vectorised executor, and are counted (:attr:`ShadowCohort.unbatched`).

On a GPU (``device: cuda``) the shadows' data and models live there, and a group of K shadows' clients is one set of
batched products per lock step instead of K.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import greenlet
import torch

from secure_fed.plugin_api.attacks import (
    VectorizedExecutor,
    group_key,
    linear_chain,
    long_lived_frozen,
    train_group,
)

#: the devices whose autocast state is thread-local torch state a coroutine switch must carry
_AUTOCAST_DEVICES = ("cpu", "cuda")


def _thread_state() -> tuple:
    """Torch's thread-local modes a coroutine may be inside when it switches (grad mode; autocast on and its dtype
    per device): the coroutines share one thread, so each switch saves its side's state and restores it after."""
    return torch.is_grad_enabled(), tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES)


def _restore_thread_state(state: tuple) -> None:
    grad, autocast = state
    torch.set_grad_enabled(grad)
    for d, (on, dtype) in zip(_AUTOCAST_DEVICES, autocast, strict=True):
        torch.set_autocast_enabled(d, on)
        torch.set_autocast_dtype(d, dtype)


class CohortExecutor(VectorizedExecutor):
    """One shadow's vectorised executor: its chunk's waiting clients are trained by the cohort, with the other
    shadows' (:meth:`ShadowCohort._train_for`)."""

    name = "vectorized"  # what the shadow's summary reports: its clients ran on the vectorised executor

    def __init__(self, cohort: ShadowCohort, *, chunk_clients: int | None = None):
        super().__init__(chunk_clients=chunk_clients)
        self.cohort = cohort
        self.member: _Member | None = None  # set by the member that runs with it

    def _train(self, waiting) -> dict[int, Any]:
        return self.cohort._train_for(self, waiting)


class _Member:
    """One shadow in the cohort: its run as a coroutine, and the clients it waits to have trained."""

    def __init__(self, run: Callable[[CohortExecutor], Any], executor: CohortExecutor):
        self.executor = executor
        executor.member = self
        self.glet = greenlet.greenlet(lambda *_: run(executor))
        self.waiting: list | None = None
        self.done = False
        self.result: Any = None


class ShadowCohort:
    """Runs several federations (``runs``: each a function of its executor that trains one whole run and returns
    its result) in one process, their clients' local training batched together. ``on_done(i, result)`` is called
    as run i finishes (in the order they finish; all finish in the same pass when their rounds match).
    ``chunk_clients``: each member's chunk (its clients paused at once), as ``training.chunk_clients``."""

    def __init__(self, *, chunk_clients: int | None = None):
        self.chunk_clients = chunk_clients
        #: client updates trained in a batched group, and those run one at a time (by reason), over every member
        self.batched = 0
        self.unbatched: Counter[str] = Counter()
        #: batched training calls (one per lock-step pass over the paused members)
        self.passes = 0
        #: the most client updates trained in one group (above one shadow's cohort: the shadows were batched together)
        self.largest_group = 0
        self._main: greenlet.greenlet | None = None

    def run(
        self,
        runs: Sequence[Callable[[CohortExecutor], Any]],
        on_done: Callable[[int, Any], None] | None = None,
        on_pass: Callable[[], None] | None = None,
    ) -> list:
        """Run every member to its end; ``on_pass()`` after each batched training pass (e.g. a progress bar)."""
        self._main = greenlet.getcurrent()
        members = [_Member(fn, CohortExecutor(self, chunk_clients=self.chunk_clients)) for fn in runs]
        replies: dict[int, dict[int, Any] | None] = {i: None for i in range(len(members))}
        with long_lived_frozen():  # as each run's own rounds (nested blocks: the outermost freezes once)
            while True:
                for i, m in enumerate(members):
                    if m.done:
                        continue
                    state = _thread_state()
                    out = m.glet.switch(replies[i])  # runs until it waits for training (returns None) or ends
                    _restore_thread_state(state)
                    replies[i] = None
                    if m.glet.dead:
                        m.done, m.result, m.waiting = True, out, None
                        if on_done is not None:
                            on_done(i, out)
                live = [(i, m) for i, m in enumerate(members) if not m.done]
                if not live:
                    break
                replies.update(self._train_all(live))
                if on_pass is not None:
                    on_pass()
        for m in members:
            self.batched += m.executor.batched
            self.unbatched.update(m.executor.unbatched)
        return [m.result for m in members]

    def _train_for(self, executor: CohortExecutor, waiting) -> dict[int, Any]:
        """Inside a member's coroutine: park its waiting clients and give control back until the cohort has
        trained them (the cohort resumes it with their replies)."""
        executor.member.waiting = waiting
        state = _thread_state()
        replies = self._main.switch()
        _restore_thread_state(state)
        return replies

    def _train_all(self, live: list[tuple[int, _Member]]) -> dict[int, dict[int, Any]]:
        """Every paused member's waiting clients, grouped across members (equal shapes, settings and loss), each
        group trained once; returns each member's replies by client coroutine id."""
        groups: dict[tuple, list] = {}
        for i, m in live:
            for co in m.waiting or ():
                trainer, req = co.request
                facts = (type(trainer.model), tuple(p for _, p in linear_chain(trainer.model)), type(trainer.family))
                groups.setdefault((facts, group_key(req, own_theta=True), trainer.deferred_updates), []).append((i, co))
        out: dict[int, dict[int, Any]] = {i: {} for i, _ in live}
        self.passes += 1
        with torch.enable_grad():
            for members in groups.values():
                trainer = members[0][1].request[0]
                self.largest_group = max(self.largest_group, len(members))
                builders = train_group(
                    trainer.model, trainer.family, [co.request[1] for _, co in members], deferred=trainer.deferred_updates
                )
                for (i, co), b in zip(members, builders, strict=True):
                    out[i][id(co)] = b
        for _, m in live:
            m.waiting = None
        return out


def train_shadows_together(runs: dict[int, Any], *, on_done: Callable[[int, Any], None], progress=None) -> ShadowCohort:
    """Train the built shadow :class:`~secure_fed.engine.Experiment` s ``runs`` (by shadow index) as one cohort;
    ``on_done(k, experiment)`` as shadow k finishes; ``progress`` (a :class:`~secure_fed.progress.Phase`) advanced by
    each shadow round done. Returns the cohort (its counts of batched and one-at-a-time updates)."""
    keys = list(runs)
    exps = [runs[k] for k in keys]
    cohort = ShadowCohort(chunk_clients=exps[0].plan.training.chunk_clients if exps else None)
    seen = [0]

    def advance() -> None:
        now = sum(int(e.round) for e in exps)
        if progress is not None and now > seen[0]:
            progress.advance(now - seen[0])
        seen[0] = now

    def run_one(e):
        return lambda executor: e.run_rounds(progress=False, executor=executor)

    cohort.run([run_one(e) for e in exps], on_done=lambda i, _res: (advance(), on_done(keys[i], exps[i])), on_pass=advance)
    return cohort
