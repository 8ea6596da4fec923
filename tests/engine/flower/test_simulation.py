"""The Flower back end on Flower's simulation engine: the same run as in process, the guard on every message, and
a clear refusal of what it does not carry yet."""

from __future__ import annotations

import json

import pytest
from flwr.app import ConfigRecord, Message
from flwr.clientapp import ClientApp

from secure_fed.config import dump_config, load_config
from secure_fed.engine import Experiment
from secure_fed.engine.flower.apps import make_client_app
from secure_fed.engine.flower.codec import decode, encode
from secure_fed.engine.flower.simulation import run_on_flower
from secure_fed.errors import ConfigError, PrivacyViolation


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_default_run_on_flower_equals_in_process(tmp_path):
    """The embedded default (FedALC, 40 one-label clients, 60 rounds; label-set collection as a setup query):
    every released metric of every evaluated round and the ε agree within 1e-5."""
    local = Experiment(load_config(None), run_dir=tmp_path / "local").run(progress=False)
    flower = Experiment(load_config(None, ["backend=flower"]), run_dir=tmp_path / "flower").run(progress=False)
    assert flower.summary["status"] == "completed" and flower.summary["rounds_completed"] == 60
    assert flower.summary["privacy"] == local.summary["privacy"]
    a, b = _metrics(tmp_path / "local"), _metrics(tmp_path / "flower")
    assert len(a) == len(b) == 60
    compared = 0
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k, v in ra.items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, abs=1e-5), (ra["round"], k)
                compared += 1
    assert compared >= 60  # at least the training loss of every round
    for k, v in local.summary["final"].items():
        assert flower.summary["final"][k] == pytest.approx(v, abs=1e-5), k


def test_a_leaky_client_app_is_stopped_by_the_server_guard(tmp_path):
    """A ClientApp that adds a key the algorithm does not declare (here: its raw features) to its update: the
    server's guard rejects the message as it arrives, and the run stops with that error."""
    cfg = load_config(None, ["backend=flower", "training.rounds=1", "flower.num_supernodes=4"])
    exp = Experiment(cfg, run_dir=tmp_path / "run")
    honest = make_client_app(dump_config(cfg), None)
    leaky = ClientApp()

    @leaky.query()
    def query(msg, context):
        return honest(msg, context)

    @leaky.train()
    def train(msg, context):
        reply = honest(msg, context)
        payload = decode(reply.content)
        payload["raw_features"] = [1.0, 2.0]
        content = encode(payload)
        content["meta"] = ConfigRecord(dict(reply.content["meta"]))
        return Message(content, reply_to=msg)

    with pytest.raises(PrivacyViolation, match="raw_features"):
        run_on_flower(exp, progress=False, client_app=leaky)


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["protocols=[dp]", "privacy.instance={target_epsilon: 4}", "algorithm.normalize_gamma=false"],
         "protocols ['dp'] do not run on Flower yet"),
        (["training.executor=sequential", "partition.name=iid", "algorithm.name=fedavg", "model.family=linear_head"],
         "positive-only setting"),
    ],
)  # fmt: skip
def test_what_flower_does_not_carry_yet_is_a_config_error(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_config(None, ["backend=flower", *overrides])
