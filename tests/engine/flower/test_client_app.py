"""The ClientApp's copy of the run (:func:`secure_fed.engine.flower.client_app.client_replica`)."""

from __future__ import annotations

import pytest
import torch

from secure_fed.algorithms.base import SharedRows
from secure_fed.engine import Experiment, allocator
from secure_fed.engine.flower.client_app import _REPLICAS, client_replica
from tests.conftest import small_plan


@pytest.fixture
def own_process_settings(monkeypatch):
    """A copy of the run sets process-wide things (torch's threads; the allocator, first setting wins): the test
    gets a fresh allocator choice and the process gets its own settings back afterwards."""
    threads, before = torch.get_num_threads(), allocator._applied
    monkeypatch.setattr(allocator, "_tried", False)
    monkeypatch.setattr(allocator, "_applied", None)
    _REPLICAS.clear()
    yield
    _REPLICAS.clear()
    torch.set_num_threads(threads)
    if before is not None:  # the C library's settings as this process had them
        allocator._tried = False
        allocator._set_once(before)


@pytest.mark.usefixtures("own_process_settings")
@pytest.mark.parametrize("node_copy", [True, False])
def test_a_copy_of_the_run_is_built_once_and_a_nodes_copy_holds_no_dense_rows_until_read(node_copy):
    """A deployment node's copy (``node_copy``) keeps every client's dense rows as :class:`SharedRows` (a node reads
    only its own clients', so no other node's preprocessed rows sit in its memory) and takes the allocator settings
    that give freed memory back; a simulation worker's copy (it serves many nodes) keeps the run's eager rows and
    settings. One process builds each copy once per (config, data root, kind)."""
    text = small_plan().config_yaml
    exp = client_replica(text, None, threads=1, run_class=Experiment, node_copy=node_copy)
    assert client_replica(text, None, threads=1, run_class=Experiment, node_copy=node_copy) is exp
    assert [isinstance(c.__dict__["_x"], SharedRows) for c in exp.fed.clients] == [node_copy] * len(exp.fed.clients)
    assert exp.fed.clients[0].x.shape[0] == exp.fed.clients[0].num_examples > 0
    node = {"mmap_threshold": allocator.NODE_MMAP_THRESHOLD, "trim_threshold": allocator.NODE_TRIM_THRESHOLD}
    assert (allocator._applied == node) is node_copy
