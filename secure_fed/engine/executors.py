"""The executors by name (``training.executor``): the engine builds its executor from here.

The interface they implement (:class:`ClientJob`, :class:`Channel`, :class:`Executor`) and the reference
:class:`SequentialExecutor` live in :mod:`secure_fed.engine.execution`; the vectorised executor in
:mod:`secure_fed.engine.vectorized`; the Flower executor (``backend: flower``) is built by the Flower backend.
"""

from __future__ import annotations

from secure_fed.engine.execution import Executor, SequentialExecutor
from secure_fed.engine.vectorized import VectorizedExecutor

EXECUTORS: dict[str, type[Executor]] = {SequentialExecutor.name: SequentialExecutor, VectorizedExecutor.name: VectorizedExecutor}
