"""The vectorised executor (``training.executor: vectorized``): a round's clients train together.

A client's function (``job.fn``: the algorithm's ``client_update`` inside the protocol layers' and callbacks'
client mods) is arbitrary code, and somewhere inside it calls the local trainer. To train many clients together
without changing any of that code, each client's function runs as a coroutine (a ``greenlet``, on the executor's
own thread: torch's thread pool and thread-local state stay the engine's), and only one of them runs at any time,
so their code runs one piece after another, as on the sequential executor, in the cohort's order. When a client's function reaches
:meth:`~secure_fed.algorithms.client.LocalTrainer.update` the trainer hands its request to the executor's
:class:`ChunkBatching` (the engine gives the trainer ``executor.batching``) and the client pauses. Once
every client of the chunk has paused (or finished), the executor trains the paused requests together
(:func:`secure_fed.algorithms.batched_sgd.train_group`, exact lock-step SGD, one group per equal θ, row count and
settings) and resumes each client with its own result; its function then goes on (protocol layers mask, encrypt,
clip …) and its wire message is yielded in cohort order, one at a time, as the engine expects.

A request with a client objective (:mod:`secure_fed.algorithms.objective`) trains in its group when the objective fits
the closed form: ``begin`` runs in the client's turn before it pauses, its affine weight term
(:class:`~secure_fed.algorithms.objective.AffineTerm`: a proximal term, a constant correction) travels with the
request and the batched step adds it, and ``end`` runs with the client's update when it resumes. A request that the
batched trainer does not cover (:func:`~secure_fed.algorithms.batched_sgd.unbatchable`: DP-SGD, momentum/Adam,
dropout, label mask training, a model that is not a Linear/ReLU chain; or an objective that says why it does not fit,
:meth:`~secure_fed.algorithms.objective.ClientObjective.unbatched_reason`: a per-example term such as a contrastive
one, a weight term not declared affine) runs at once with the reference trainer, inside that client's own turn. It is
counted by reason, logged once per reason, and reported in ``summary.json`` under ``executor``: nothing falls back
silently.

Memory: clients run in chunks (``training.chunk_clients``; default: as many as an estimate of their training
history fits in a quarter of the memory available, at most 1,024). A client's dense update is formed only when it
resumes, so one chunk's histories and one update are in memory at a time, not every client's update. With deferred
updates (``training.deferred_updates``, :mod:`secure_fed.models.group_updates`) no dense weight update is formed
unless something reads it: the round's sum adds the chunk's updates in a few products per layer once the last of
them arrives, and the chunk's histories are freed then, before the next chunk trains (when some of a chunk's updates
reach the sum dense, e.g. made so by a client mod, the rest are summed, and the group freed, at the round's end).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import greenlet
import torch

from secure_fed.algorithms.base import Payload
from secure_fed.algorithms.batched_sgd import ModelFacts, TrainRequest, group_key, linear_chain, train_group, unbatchable
from secure_fed.algorithms.client import LocalTrainer, LocalTraining, begin_objective
from secure_fed.algorithms.objective import ClientObjective
from secure_fed.algorithms.per_sample import GradientPrivatizer
from secure_fed.engine.execution import Channel, ClientJob, Executor
from secure_fed.models.sparse_rows import dense_delta

log = logging.getLogger(__name__)

#: at most this many clients in one chunk (threads alive at once)
MAX_CHUNK = 1024


class _Cancelled(Exception):
    """Thrown into a paused client when the executor stops early (an error elsewhere, or the consumer closed)."""


class _ClientCoroutine:
    """``fn()`` as a greenlet: it runs only inside :meth:`resume`, on the executor's own thread (so torch's thread
    pool, grad mode and the rest of the thread's state are the executor's), and gives control back when it asks
    the trainer to train or when it finishes."""

    def __init__(self, fn, executor: VectorizedExecutor):
        self._fn = fn
        self._executor = executor
        self._g = greenlet.greenlet(self._main)
        self.request: tuple[LocalTrainer, TrainRequest] | None = None
        self.done = False
        self.result: Payload | None = None
        self.error: BaseException | None = None

    def _main(self, _: Any = None) -> None:
        try:
            self.result = self._fn()
        except _Cancelled:
            pass
        except BaseException as e:  # handed to the executor, which raises it
            self.error = e
        finally:
            self.done = True

    def submit(self, trainer: LocalTrainer, req: TrainRequest, privatizer, objective: ClientObjective | None = None) -> Payload:
        """Inside the client: the trainer's request. Unbatchable ones run now; others wait for their group. An
        ``objective`` (one that fits the closed form) begins here, its affine term joins the request, and it ends
        with the client's update."""
        reason = unbatchable(trainer.model, trainer.family, req, privatizer, facts=self._executor._facts(trainer.model))
        if reason is not None:
            self._executor._count_unbatched(reason)
            return trainer.update_one(req.payload, req.data, req.hp, req.generator, privatizer, objective)
        ctx = None
        if objective is not None:
            ctx = begin_objective(objective, req.payload, req.data, req.hp, None)
            req.affine = objective.affine_term(ctx) if objective.affine else None
        self.request = (trainer, req)
        grad = torch.is_grad_enabled()
        reply = self._g.parent.switch()  # back to the executor, until it resumes us with our reply
        torch.set_grad_enabled(grad)
        self._executor.batched += 1
        if objective is not None:
            ctx.steps = ctx.planned_steps  # plain SGD: every planned step was taken
            if type(objective).end is not ClientObjective.end:  # its update formed only for an objective that reads it
                objective.end(ctx, {n: dense_delta(t).detach() for n, t in reply["theta_delta"].items()})
        return reply

    def resume(self, value: Any = None) -> None:
        """Run the client until it pauses at the trainer or finishes."""
        self.request = None
        self._g.switch(value)

    def cancel(self) -> None:
        if self._g and not self.done:  # started and paused
            self._g.throw(_Cancelled())


class ChunkBatching:
    """The vectorised executor's :class:`~secure_fed.algorithms.client.Batching`: a request from a client of the
    chunk now running (its coroutine is the current greenlet) waits for its group; any other request (outside a
    chunk, from the engine itself, from another thread) trains at once."""

    def __init__(self) -> None:
        #: the running chunk's clients, by their greenlet
        self.clients: dict[greenlet.greenlet, _ClientCoroutine] = {}

    def submit(
        self,
        trainer: LocalTrainer,
        payload: Payload,
        data,
        hp: LocalTraining,
        generator: torch.Generator,
        privatizer: GradientPrivatizer | None,
        objective: ClientObjective | None = None,
    ) -> Payload:
        co = self.clients.get(greenlet.getcurrent())
        if co is None:  # not from a client of this chunk (e.g. the engine itself): train now
            return trainer.update_one(payload, data, hp, generator, privatizer, objective)
        reason = objective.unbatched_reason() if objective is not None else None
        if reason is not None:  # the closed form has no place for this objective's hooks: declared, counted
            co._executor._count_unbatched(f"client objective {objective.name!r} ({reason})")
            return trainer.update_one(payload, data, hp, generator, privatizer, objective)
        return co.submit(trainer, TrainRequest(payload, data, hp, generator), privatizer, objective)


class VectorizedExecutor(Executor):
    """The clients of a chunk train together (exact lock-step SGD); the reference for equal results is
    :class:`~secure_fed.engine.execution.SequentialExecutor`."""

    name = "vectorized"

    def __init__(self, *, chunk_clients: int | None = None):
        self.chunk_clients = chunk_clients
        #: client updates trained in a batched group, and those run one at a time (by reason), in this process
        self.batched = 0
        self.unbatched: Counter[str] = Counter()
        #: each model's facts for :func:`unbatchable`, by id (the model is kept, so the id is not reused)
        self._model_facts: dict[int, tuple[torch.nn.Module, ModelFacts]] = {}
        #: where the engine's trainer hands its requests (the engine sets ``trainer.batching`` to it)
        self.batching = ChunkBatching()

    @classmethod
    def from_config(cls, training) -> VectorizedExecutor:
        return cls(chunk_clients=training.chunk_clients)

    def _facts(self, model: torch.nn.Module) -> ModelFacts:
        if id(model) not in self._model_facts:
            self._model_facts[id(model)] = (model, ModelFacts.of(model))
        return self._model_facts[id(model)][1]

    def _count_unbatched(self, reason: str) -> None:
        if reason not in self.unbatched:
            log.warning("note: vectorized executor: updates with %s train one client at a time", reason)
        self.unbatched[reason] += 1

    def report(self) -> dict[str, Any]:
        return {"name": self.name, "updates_batched": self.batched, "updates_one_at_a_time": dict(self.unbatched)}

    def run(self, jobs: Iterable[ClientJob], channel: Channel) -> Iterator[tuple[int, Payload]]:
        it = iter(jobs)
        budget: int | None = None
        while True:
            chunk: list[ClientJob] = []
            used = 0
            for job in it:
                chunk.append(job)
                data = channel.client(job.cid)
                if budget is None:  # the memory of the device the clients' data (and so their training) lives on
                    budget = _memory_budget(data.pos.device)
                used += _history_bytes(data)
                if len(chunk) >= (self.chunk_clients or MAX_CHUNK) or (self.chunk_clients is None and used >= budget):
                    break
            if not chunk:
                return
            yield from self._run_chunk(chunk, channel)

    def _run_chunk(self, chunk: list[ClientJob], channel: Channel) -> Iterator[tuple[int, Payload]]:
        coros: list[_ClientCoroutine] = []
        for job in chunk:
            channel.down(job)
            data = channel.client(job.cid)
            coros.append(_ClientCoroutine(lambda job=job, data=data: job.fn(job.payload, data), self))
        self.batching.clients.update({co._g: co for co in coros})
        emitted = 0
        try:
            for co in coros:
                co.resume()
                self._raise(co)
            while True:
                waiting = [co for co in coros if not co.done and co.request is not None]
                if not waiting:
                    break
                replies = self._train(waiting)
                for co in waiting:
                    co.resume(replies[id(co)]())  # its dense update is formed now: one at a time
                    self._raise(co)
                    while emitted < len(coros) and coros[emitted].done:
                        done = coros[emitted]
                        emitted += 1
                        yield chunk[emitted - 1].cid, channel.up(chunk[emitted - 1].cid, done.result)
                        done.result = None
            while emitted < len(coros):
                if not coros[emitted].done:
                    raise RuntimeError("vectorized executor: a client neither finished nor asked to train")
                yield chunk[emitted].cid, channel.up(chunk[emitted].cid, coros[emitted].result)
                coros[emitted].result = None
                emitted += 1
        finally:
            for co in coros:
                co.cancel()
                self.batching.clients.pop(co._g, None)

    @staticmethod
    def _raise(co: _ClientCoroutine) -> None:
        if co.error is not None:
            raise co.error

    def _train(self, waiting: list[_ClientCoroutine]) -> dict[int, Any]:
        groups: dict[tuple, list[_ClientCoroutine]] = {}
        for co in waiting:
            trainer, req = co.request
            groups.setdefault((id(trainer), group_key(req)), []).append(co)
        out: dict[int, Any] = {}
        with torch.enable_grad():
            for members in groups.values():
                trainer = members[0].request[0]
                builders = train_group(
                    trainer.model, trainer.family, [co.request[1] for co in members], deferred=trainer.deferred_updates
                )
                out.update({id(co): b for co, b in zip(members, builders, strict=True)})
        return out


def _history_bytes(data) -> int:
    """A rough upper bound on one client's batched-training memory: its padded rows × every layer's input and
    output width × (history + autograd) × 4 bytes. Without a known chain, the feature width alone."""
    n = int(data.num_examples)
    return max(1, 4 * 4 * (n + 32) * (int(data.x.shape[1]) + 8192))


def _memory_budget(device: torch.device) -> int:
    """A quarter of the memory available now on ``device`` (GPU: free device memory plus what torch's caching
    allocator holds unused; CPU: MemAvailable), 1 GiB when unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return (free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)) // 4
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 4
    except OSError:
        pass
    return 1 << 30


__all__ = ["ChunkBatching", "VectorizedExecutor", "linear_chain"]
