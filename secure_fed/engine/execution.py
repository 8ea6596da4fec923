"""The executor interface: how a round's clients are run (the registry by name: :mod:`secure_fed.engine.executors`).

The engine hands an executor the round's client jobs (a client id, its payload and its wrapped client
function, all built lazily) and a :class:`Channel` (the guarded channel: ``down`` checks a payload before it
leaves the server, ``up`` logs the wire message and shows it to the callbacks); the executor yields
``(client id, wire message)`` pairs, which the engine submits to the round's aggregation session in cohort
order. Nothing in the algorithms or layers may assume how the jobs run: a layer's client-side code runs inside
``job.fn``, or, on a remote executor, inside the same function rebuilt by the client
(:meth:`~secure_fed.engine.runner.Experiment.client_fn`).

:class:`SequentialExecutor` (the reference, ``training.executor: sequential``) runs the clients one after
another in this process and yields as it goes, so at most one client's update is in memory. Other executors
implement the same interface:

* :class:`~secure_fed.engine.vectorized.VectorizedExecutor` (``training.executor: vectorized``) trains the
  clients of a chunk together;
* :class:`~secure_fed.engine.flower.executor.FlowerExecutor` (``backend: flower``) sends each payload to the
  client's Flower node and yields the node's reply.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from secure_fed.algorithms.base import ClientData, ClientFn, Payload
from secure_fed.algorithms.client import Batching


@dataclass(frozen=True)
class ClientJob:
    """One client's work in a round."""

    cid: int
    payload: Payload
    fn: ClientFn
    #: the round's client-side protocol steps as public data (what ``fn`` runs after training), for remote clients
    plan: tuple = ()


def _no_dropouts(cid: int, reason: str) -> None:
    raise RuntimeError(f"client {cid} dropped out ({reason}), and this channel takes no dropouts")


@dataclass(frozen=True)
class Channel:
    """The server's side of the guarded channel for one round."""

    #: check a job's payload against the algorithm's declarations before it leaves the server
    down: Callable[[ClientJob], None]
    #: a client's wire message has arrived: log it, show it to the callbacks; returns it
    up: Callable[[int, Payload], Payload]
    #: client ``cid``'s data (in-process executors only: the client function runs here)
    client: Callable[[int], ClientData]
    #: client ``cid``'s update will not arrive (a remote node failed or timed out), and why; may abort the round
    drop: Callable[[int, str], None] = _no_dropouts


class Executor(ABC):
    name: str = ""
    #: True when client code runs elsewhere (setup queries must then name a registered client function)
    remote: bool = False
    #: where the engine's trainer hands its requests (:attr:`~secure_fed.algorithms.client.LocalTrainer.batching`):
    #: set by an executor that trains clients together; None: each client trains at once, inside its own function
    batching: Batching | None = None

    @classmethod
    def from_config(cls, training) -> Executor:
        """The executor for a run's ``training`` config section."""
        return cls()

    def report(self) -> dict:
        """What ``summary.json`` says about how the clients ran."""
        return {"name": self.name}

    @abstractmethod
    def run(self, jobs: Iterable[ClientJob], channel: Channel) -> Iterator[tuple[int, Payload]]:
        """Yield ``(cid, wire)`` for every job, in the jobs' order."""


class SequentialExecutor(Executor):
    """One client after another, in process (the reference executor)."""

    name = "sequential"

    def run(self, jobs: Iterable[ClientJob], channel: Channel) -> Iterator[tuple[int, Payload]]:
        for job in jobs:
            channel.down(job)
            yield job.cid, channel.up(job.cid, job.fn(job.payload, channel.client(job.cid)))
