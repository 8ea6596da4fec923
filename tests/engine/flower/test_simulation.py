"""The Flower back end on Flower's simulation engine: the same run as in process, the guard on every message, and
a clear refusal of what it does not carry yet."""

from __future__ import annotations

import json
import re

import pytest
import torch
from flwr.app import ConfigRecord, Message
from flwr.clientapp import ClientApp

from secure_fed.config import build_plan, dump_config, load_config, load_plan
from secure_fed.engine import Experiment
from secure_fed.engine.flower.client_app import make_client_app
from secure_fed.engine.flower.codec import decode, encode
from secure_fed.engine.flower.simulation import run_on_flower
from secure_fed.errors import ConfigError, PrivacyViolation


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


EVERY5 = ["evaluation.every=5"]


def test_default_run_on_flower_equals_in_process_and_resumes_from_its_checkpoint(tmp_path):
    """The embedded default (FedALC, 40 one-label clients; label-set collection as a setup query), 10 of its 60
    rounds (evaluated every 5): 5 rounds on Flower, then the same run directory resumed to 10 on Flower (a new Flower
    run; the nodes hold no state between rounds without protocol layers). Every released metric of every round and
    the ε agree with 10 uninterrupted rounds in process within 1e-5. All 60 rounds, in one Flower run:
    ``python benchmarks/flower_parity.py`` (README)."""
    # in process at one torch thread, as each Flower node trains (Ray starts its workers with OMP_NUM_THREADS=1):
    # at another thread count the client matmuls reassociate and the metrics drift by up to ~3e-4 over 60 rounds,
    # on either back end alike (measured in process: 1 vs 2 threads)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local_exp = Experiment(load_plan(None, ["training.rounds=10", *EVERY5]), run_dir=tmp_path / "local")
        local = local_exp.run(progress=False)
    finally:
        torch.set_num_threads(threads)  # later tests in the session run at the default again
    # 7 messages in flight at most: each round's 40 clients go out in 6 batches, replies summed in cohort order
    common = ["backend=flower", "flower.max_in_flight=7", *EVERY5]  # the resume reads the first run's last.pt
    first = Experiment(load_plan(None, [*common, "training.rounds=5"]), run_dir=tmp_path / "flower")
    first.run(progress=False)
    # the clients really ran on Flower nodes: every training job and the setup query went out as messages
    assert first.executor.name == "flower"
    assert first.executor.sent == {"whoami": 40, "query": 40, "train": 5 * 40}
    flower_exp = Experiment(load_plan(None, [*common, "training.rounds=10"]), run_dir=tmp_path / "flower")
    assert flower_exp.resume() and flower_exp.round == 5
    flower = flower_exp.run(progress=False)
    # the resumed run trains rounds 6-10 only; the label sets came back from the checkpoint (no setup query)
    assert flower_exp.executor.sent == {"whoami": 40, "train": 5 * 40}
    for n, t in local_exp.theta.items():
        assert torch.allclose(flower_exp.theta[n], t, atol=1e-5, rtol=0), n
    assert torch.allclose(flower_exp.W, local_exp.W, atol=1e-5, rtol=0)
    assert flower.summary["status"] == "completed" and flower.summary["rounds_completed"] == 10
    assert flower.summary["privacy"] == local.summary["privacy"]
    a, b = _metrics(tmp_path / "local"), _metrics(tmp_path / "flower")
    assert [r["round"] for r in b] == list(range(1, 11))
    assert sum("P@1" in r for r in b) == 2  # two evaluations, one on each side of the resume
    compared = 0
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, abs=1e-5), (ra["round"], k)
                compared += 1
    assert compared >= 10  # at least the training loss of every round
    for k, v in local.summary["final"].items():
        assert flower.summary["final"][k] == pytest.approx(v, abs=1e-5), k


def test_a_leaky_client_app_is_stopped_by_the_server_guard(tmp_path):
    """A ClientApp that adds a key the algorithm does not declare (here: its raw features) to its update: the
    server's guard rejects the message as it arrives, and the run stops with that error."""
    cfg = load_config(None, ["backend=flower", "training.rounds=1", "flower.num_supernodes=4"])
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    honest = make_client_app(dump_config(cfg), None, Experiment)
    leaky = ClientApp()

    @leaky.query()
    def query(msg, context):
        return honest(msg, context)

    @leaky.train()
    def train(msg, context):
        reply = honest(msg, context)
        payload = decode(reply.content, meta_keys=frozenset({"seq"}))
        payload["raw_features"] = [1.0, 2.0]
        content = encode(payload)
        content["meta"] = ConfigRecord(dict(reply.content["meta"]))
        return Message(content, reply_to=msg)

    with pytest.raises(PrivacyViolation, match="raw_features"):
        run_on_flower(exp, progress=False, client_app=leaky)


def test_what_flower_does_not_carry_is_a_config_error():
    with pytest.raises(ConfigError, match=re.escape("backend=flower replaces training.executor")):
        load_config(None, ["backend=flower", "training.executor=vectorized"])


def test_a_layer_whose_spec_does_not_run_on_flower_is_a_config_error(monkeypatch):
    """A plugin layer that has not said its client side runs on Flower (``LayerSpec.runs_on_flower``) is refused."""
    import dataclasses

    import secure_fed.plugin_specs as specs

    real = specs.layer_specs()
    stub = dataclasses.replace(real["secure_aggregation"], name="stub_layer", runs_on_flower=False, validate=None)
    monkeypatch.setattr(specs, "layer_specs", lambda: {**real, "stub_layer": stub})
    load_config(None, ["protocols=[stub_layer]"])  # fine in process
    with pytest.raises(ConfigError, match=re.escape("protocols ['stub_layer'] do not run on Flower yet")):
        load_config(None, ["backend=flower", "protocols=[stub_layer]"])


def test_a_callback_that_acts_inside_clients_is_refused_before_anything_is_written(tmp_path):
    """A plugin callback with a client_mod would be silently dropped on Flower nodes: the run refuses to start."""
    from secure_fed.engine.callbacks import Callback
    from secure_fed.errors import SecureFedError

    class Tap(Callback):
        name = "tap"

        def client_mod(self, fn):
            return fn

    exp = Experiment(load_plan(None, ["backend=flower"]), run_dir=tmp_path / "run")
    exp.callbacks.insert(0, Tap())
    with pytest.raises(SecureFedError, match="tap act inside the clients' code"):
        exp.run(progress=False)
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_a_node_answers_only_for_its_own_clients_and_registered_functions(monkeypatch, tmp_path):
    """The real ClientApp, called in process: node 1 of 4 trains client 5 (5 mod 4 = 1) and refuses client 2 (another
    node's), client -3 (out of range, though -3 mod 4 = 1), and a query naming a function nobody registered."""
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from secure_fed.engine.flower.executor import request

    for attr, value in (("_run_id", 1), ("_node_id", 7), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, attr, value, raising=False)
    # a node's copy sets its process to one torch thread; this process runs other tests after this one
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    cfg = load_config(None, ["backend=flower"])
    app = make_client_app(dump_config(cfg), None, Experiment)
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 4}, state=RecordDict(),
                  run_config={})  # fmt: skip
    server = Experiment(build_plan(cfg), run_dir=tmp_path / "server")  # only to build real payloads

    def train(cid):
        client = server.fed.clients[cid] if 0 <= cid < len(server.fed.clients) else server.fed.clients[1]
        payload = server.algorithm.downlink(server.theta, server.W, client.known_labels)
        content = request("train", payload, cid=cid, round=0)
        content["meta"]["seq"] = 0
        return app(Message(content, dst_node_id=7, message_type="train"), ctx)

    reply = decode(train(5).content, meta_keys=frozenset({"seq"}))
    assert set(reply) >= {"theta_delta", "loss"}
    for foreign in (2, -3):
        with pytest.raises(Exception, match=f"client {foreign} does not live on partition 1 of 4"):
            train(foreign)
    content = request("query", {"tokenizer": "sha256"}, cid=5, fn="os:system")
    content["meta"]["seq"] = 0
    with pytest.raises(Exception, match="os:system is not a registered client function"):
        app(Message(content, dst_node_id=7, message_type="query"), ctx)


def test_ray_gets_no_more_cpus_than_the_nodes_use(monkeypatch):
    """Flower starts an actor per client_cpus of Ray's CPUs up front: a 4-node run on a 64-core machine gets 4."""
    from secure_fed.engine.flower.simulation import ray_cpus

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(64)))
    assert ray_cpus(4, 1.0) == 4 and ray_cpus(4, 2.0) == 8 and ray_cpus(3, 0.5) == 2 and ray_cpus(100, 1.0) == 64
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert ray_cpus(40, 1.0) == 2 and ray_cpus(1, 1.0) == 1
