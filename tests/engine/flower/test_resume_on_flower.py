"""Resume on Flower when the clients keep secrets or models on the nodes. Each node keeps its clients' state in
its own storage too (a file per node under the run's public session token, private to its owner; in simulation
beside the run directory, never in it), so a resumed run, a new Flower run, takes it up again: the same keyed
label order, the same clients' own models. A node without its state refuses the resumed run before any round."""

from __future__ import annotations

import shutil
import stat

import pytest

from secure_fed.engine import Experiment
from secure_fed.engine.flower.client_app import read_node_state_file
from secure_fed.engine.flower.executor import FlowerError
from secure_fed.engine.flower.simulation import node_storage_dir
from tests.conftest import small_plan
from tests.engine.flower.nodes import assert_same_run, run_in_process, server_side_bytes

COMMON = ["training.rounds=4", "evaluation.every=2", "output.checkpoint_every=2", "flower.num_supernodes=4"]
KEYED = [*COMMON, "protocols=[keyed_hashing]"]
LOCAL = [*COMMON, "model.family=linear_head", "partition.name=cmda", "partition.num_clients=5",
         "partition.kmodes_inits=2", "training.client_lr=0.1", "algorithm.name=local", "evaluation.every=1"]  # fmt: skip


def _first_half(overrides, run_dir):
    exp = Experiment(small_plan(*overrides, "backend=flower", "training.rounds=2"), run_dir=run_dir)
    exp.run(progress=False)
    return exp


def _resumed(overrides, run_dir):
    exp = Experiment(small_plan(*overrides, "backend=flower"), run_dir=run_dir)
    assert exp.resume() and exp.round == 2
    return exp, exp.run(progress=False)


def test_a_keyed_hashing_run_resumes_on_flower(tmp_path):
    first = _first_half(KEYED, tmp_path / "f")
    files = sorted((node_storage_dir(tmp_path / "f") / first.flower_session).glob("node-*.state"))
    assert [f.name for f in files] == [f"node-{p}.state" for p in range(4)]
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    rings = {}
    for f in files:
        rings.update(read_node_state_file(f)["protocols"]["keyed_hashing"])
    assert sorted(rings) == list(range(len(first.fed.clients)))
    run_key, salt = rings[0]["run_key"], rings[0]["salt"]

    resumed, result = _resumed(KEYED, tmp_path / "f")
    assert resumed.flower_session == first.flower_session and result.summary["rounds_completed"] == 4
    secrets = [run_key, salt, *(r["sk"] for r in rings.values())]
    assert not [s for s in secrets if s in server_side_bytes(resumed)]  # the nodes' files are not the server's
    local, local_result = run_in_process(KEYED, tmp_path / "local", run_key=(run_key, salt))
    assert_same_run(resumed, result, local, local_result)  # the same keys, label order and model as 4 rounds


def test_local_models_resume_on_flower_and_a_node_without_its_state_refuses(tmp_path):
    first = _first_half(LOCAL, tmp_path / "f")
    store = node_storage_dir(tmp_path / "f") / first.flower_session
    shutil.copytree(store, tmp_path / "kept")
    (store / "node-1.state").unlink()  # node 1 lost its disk
    with pytest.raises(FlowerError, match="node 1 has no state file"):
        _resumed(LOCAL, tmp_path / "f")
    assert len((tmp_path / "f" / "metrics.jsonl").read_text().splitlines()) == 2  # no round ran

    shutil.copy(tmp_path / "kept" / "node-1.state", store / "node-1.state")
    resumed, result = _resumed(LOCAL, tmp_path / "f")
    local, local_result = run_in_process(LOCAL, tmp_path / "local")
    # each client's own model went on from where its node stored it: the same AmAP/WmAP every round
    for f, h in zip(result.history, local_result.history, strict=True):
        for k in ("AmAP", "AmAP_std", "WmAP"):
            assert f[k] == pytest.approx(h[k], abs=1e-5), (h["round"], k)


# DP-SGD in client training: each client's randomness lives on its node and is addressed by the round, and a node
# refuses a round it trained before unless the payload and plan are the same (test_dp_on_flower.py)
DP_LOCAL = [*COMMON, "protocols=[dp]", "algorithm.name=fedaws", "privacy.noise_seed=3", "flower.on_client_failure=stop",
            "privacy.local={noise_multiplier: 1.0, clip_norm: 1.0, batch_sample_rate: 0.5, "
            "max_labels_per_instance: 8}"]  # fmt: skip


def test_a_resumed_run_replays_a_round_its_nodes_trained_and_they_take_it(tmp_path):
    """The server stops after its nodes trained round 2 but before it checkpointed it: the resumed run replays round
    2 from the round-2 checkpoint, on the same model, so the nodes (which remember round 2's payload and plan) train
    it again instead of refusing it, and the run ends as an uninterrupted one."""
    first = _first_half(DP_LOCAL, tmp_path / "f")
    shutil.copytree(tmp_path / "f", tmp_path / "server-at-2")  # the server's side as checkpointed after 2 rounds
    ahead = Experiment(small_plan(*DP_LOCAL, "backend=flower", "training.rounds=3"), run_dir=tmp_path / "f")
    assert ahead.resume() and ahead.run(progress=False).summary["rounds_completed"] == 3  # the nodes train round 2
    trained = {}
    for f in (node_storage_dir(tmp_path / "f") / first.flower_session).glob("node-*.state"):
        for cid, st in read_node_state_file(f)["protocols"]["dp"].items():
            trained[cid] = st["trained"]
    assert trained and all(2 in rounds for rounds in trained.values() if rounds)  # round 2 remembered on the nodes
    shutil.rmtree(tmp_path / "f")
    shutil.copytree(tmp_path / "server-at-2", tmp_path / "f")  # the server lost round 2: it resumes from round 2

    resumed, result = _resumed(DP_LOCAL, tmp_path / "f")
    assert result.summary["status"] == "completed" and result.summary["rounds_completed"] == 4
    local, local_result = run_in_process(DP_LOCAL, tmp_path / "local")
    assert_same_run(resumed, result, local, local_result)
