"""The Flower tests share one Ray cluster.

Flower's Ray back end starts Ray when it is not running (``ray.init``, 5–7 s here) and shuts it down at the end of
every simulation. Here the shutdown is deferred to the end of the test session, so each simulation after the first
finds Ray running. Each simulation still creates its own actors and terminates them at its end (Flower's
``terminate_all_actors``), so no client state carries over between tests; node state that is meant to outlive a
run lives on disk (``state_dir``), as in production. ``run_on_flower`` passes the same ``ray.init`` arguments every
time, so the shared cluster is the one each test would have started.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_ray_cluster():
    import ray

    real_shutdown = ray.shutdown
    ray.shutdown = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ray.shutdown = real_shutdown
        if ray.is_initialized():
            real_shutdown()
