"""The ClientApp's copy of the run (:func:`secure_fed.engine.flower.client_app.client_replica`)."""

from __future__ import annotations

from secure_fed.algorithms.base import SharedRows
from secure_fed.engine import Experiment
from secure_fed.engine.flower.client_app import _REPLICAS, client_replica
from tests.conftest import small_plan


def test_a_nodes_copy_of_the_run_is_built_once_and_holds_no_clients_rows_until_read():
    """The copy a node builds keeps every client's rows as :class:`SharedRows` (a node reads only its own clients',
    so no other node's rows sit in its memory), and one process builds it once per (config, data root)."""
    text = small_plan().config_yaml
    _REPLICAS.clear()
    try:
        exp = client_replica(text, None, threads=1, run_class=Experiment)
        assert client_replica(text, None, threads=1, run_class=Experiment) is exp
        assert all(isinstance(c.__dict__["_x"], SharedRows) for c in exp.fed.clients)
        assert exp.fed.clients[0].x.shape[0] == exp.fed.clients[0].num_examples > 0
    finally:
        _REPLICAS.clear()
