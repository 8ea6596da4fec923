"""Keyed hashing on Flower: the key exchange runs as query messages to each node's copy of the layer, the keyrings
live in each node's ``context.state`` (never in a message to the ServerApp, never on the server), each node
computes W's row order from its own key, and the run equals the in-process run with the same run key."""

from __future__ import annotations

import json

import pytest

from secure_fed.engine import Experiment
from tests.conftest import small_plan
from tests.engine.flower.nodes import assert_same_run, run_in_process, run_recorded, server_side_bytes

RUN = ["protocols=[keyed_hashing]", "training.rounds=3", "evaluation.every=3", "flower.num_supernodes=4",
       "output.log_messages=true"]  # fmt: skip


def test_keyed_hashing_on_flower(tmp_path):
    fl, result, rings_dir = run_recorded(RUN, tmp_path)
    assert result.summary["status"] == "completed"
    rings = {int(p.stem): {k: bytes.fromhex(v) if v else None for k, v in json.loads(p.read_text()).items()}
             for p in rings_dir.glob("[0-9]*.json")}  # fmt: skip
    assert sorted(rings) == list(range(len(fl.fed.clients)))  # every client has a keyring, on its node
    run_keys = {(r["run_key"], r["salt"]) for r in rings.values()}
    assert len(run_keys) == 1  # the dealer's key reached every client through the sealed exchange
    run_key, salt = next(iter(run_keys))

    # the server holds no keyring and received no secret: not in its layer, its messages, its files
    assert fl.stack.by_name()["keyed_hashing"]._clients == {}
    secrets = [run_key, salt, *(r["sk"] for r in rings.values())]
    server_side = server_side_bytes(fl)
    assert len(fl.messages) > 0
    for s in secrets:
        assert s not in server_side

    # the clients' keyrings stayed on the nodes: the run cannot be resumed in process (nor on Flower, below)
    from secure_fed.errors import SecureFedError

    with pytest.raises(SecureFedError, match="in process: the clients' state of keyed_hashing"):
        Experiment(small_plan(*RUN), run_dir=tmp_path / "flower").resume()

    # the same run in process, its dealer drawing the same run key and salt: the same model
    local, local_result = run_in_process(RUN, tmp_path / "local", run_key=(run_key, salt))
    assert (local.label_perm == fl.label_perm).all()  # the server's row order: the ranks of the same pseudonyms
    assert_same_run(fl, result, local, local_result)


def test_a_keyed_hashing_checkpoint_without_a_node_session_does_not_resume_on_flower(tmp_path):
    """A checkpoint that names no Flower session (the nodes stored nothing under it): resuming is refused before
    anything starts (test_resume_on_flower.py resumes one that does)."""
    from secure_fed.errors import SecureFedError

    exp = Experiment(small_plan(*RUN, "backend=flower"), run_dir=tmp_path / "run")
    exp.round = 2  # as after resume() from a round-2 checkpoint written before node storage
    with pytest.raises(SecureFedError, match="cannot resume at round 2: the clients of keyed_hashing keep"):
        exp.run(progress=False)
    assert not (tmp_path / "run" / "config.yaml").exists()
