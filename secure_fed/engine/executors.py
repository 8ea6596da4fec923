"""Executors: how a round's clients are run.

The engine hands an executor the round's client jobs (a client id, its payload and its wrapped client
function, all built lazily) and a ``exchange`` function (the guarded channel: downlink check, the client
function, wire logging); the executor yields ``(client id, wire message)`` pairs, which the engine
submits to the round's aggregation session in cohort order. Nothing in the algorithms or layers may
assume how the jobs run: a layer's client-side code runs inside ``job.fn``.

:class:`SequentialExecutor` (the reference, ``training.executor: sequential``) runs the clients one after
another in this process and yields as it goes, so at most one client's update is in memory. Later
executors (vectorised clients, Flower) implement the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from secure_fed.algorithms.base import ClientFn, Payload


@dataclass(frozen=True)
class ClientJob:
    """One client's work in a round."""

    cid: int
    payload: Payload
    fn: ClientFn


class Executor(ABC):
    name: str = ""

    @abstractmethod
    def run(self, jobs: Iterable[ClientJob], exchange: Callable[[ClientJob], Payload]) -> Iterator[tuple[int, Payload]]:
        """Yield ``(cid, wire)`` for every job, in the jobs' order."""


class SequentialExecutor(Executor):
    """One client after another, in process (the reference executor)."""

    name = "sequential"

    def run(self, jobs: Iterable[ClientJob], exchange: Callable[[ClientJob], Payload]) -> Iterator[tuple[int, Payload]]:
        for job in jobs:
            yield job.cid, exchange(job)


EXECUTORS: dict[str, type[Executor]] = {SequentialExecutor.name: SequentialExecutor}
