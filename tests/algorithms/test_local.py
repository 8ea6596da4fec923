"""``local`` (``secure_fed/algorithms/local.py``): each client trains its own model alone (the FLAG paper's
TResNet (L)); nothing but zeros leaves a client, the server's model never moves, and the clients' own models
survive a checkpoint and resume exactly. Also the general setting's ``centralised`` upper bound."""

from __future__ import annotations

import json

import pytest
import torch

from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_plan

GENERAL = ["model.family=linear_head", "partition.name=cmda", "partition.num_clients=4", "partition.kmodes_inits=2",
           "training.client_lr=0.1"]  # fmt: skip


def test_local_clients_keep_their_own_models_and_send_nothing(tmp_path):
    exp = Experiment(small_plan(*GENERAL, "algorithm.name=local", "training.rounds=3", "evaluation.every=3",
                                  "output.log_messages=true"), run_dir=tmp_path)  # fmt: skip
    theta0 = {n: t.clone() for n, t in exp.theta.items()}
    res = exp.run(progress=False)
    ups = [m["message"] for m in exp.messages if m["direction"] == "up"]
    assert len(ups) == 3 * 4 and all(not t.any() for m in ups for t in m["theta_delta"].values())  # zeros only
    assert all(torch.equal(exp.theta[n], theta0[n]) for n in theta0)  # the server's model never moves
    own = [c.state["theta"] for c in exp.fed.clients]
    for i, a in enumerate(own):  # every client trained its own, different model
        assert any(not torch.equal(a[n], theta0[n]) for n in theta0)
        for b in own[i + 1 :]:
            assert any(not torch.equal(a[n], b[n]) for n in theta0)
    final = res.summary["final"]
    assert set(final) == {"AmAP", "AmAP_std", "WmAP"}  # no global model: no pooled mAP, no GmAP


def test_local_resumes_each_clients_own_model_exactly(tmp_path):
    ov = [*GENERAL, "algorithm.name=local", "training.rounds=4", "evaluation.every=1", "output.checkpoint_every=2"]
    a = Experiment(small_plan(*ov), run_dir=tmp_path / "a")
    a.run(progress=False)
    Experiment(small_plan(*ov, "training.rounds=2"), run_dir=tmp_path / "b").run(progress=False)
    b = Experiment(small_plan(*ov), run_dir=tmp_path / "b")
    assert b.resume() and b.round == 2
    b.run(progress=False)
    for ca, cb in zip(a.fed.clients, b.fed.clients, strict=True):
        assert all(torch.equal(ca.state["theta"][n], cb.state["theta"][n]) for n in ca.state["theta"])
    read = [[json.loads(x)["AmAP"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in "ab"]
    assert read[0] == read[1] and len(read[0]) == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algorithm.name=local", 'protocols=["secure_aggregation"]'], "nothing to protect"),
        (["algorithm.name=centralised", 'protocols=["secure_aggregation"]'], "no protocol layer applies"),
        (["algorithm.name=local", "model.family=embedding"], "set model.family: linear_head"),
        (["algorithm.name=centralised", "partition.name=positive_only"], "needs clients with full label vectors"),
    ],
)
def test_general_baselines_refuse_what_they_cannot_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[*GENERAL, *overrides])


def test_centralised_trains_on_all_training_data_with_bce_and_reports_gmap(tmp_path):
    exp = Experiment(small_plan(*GENERAL, "algorithm.name=centralised", "training.rounds=2", "evaluation.every=1",
                                  "output.log_messages=true"), run_dir=tmp_path)  # fmt: skip
    res = exp.run(progress=False)
    assert len(exp.fed.clients) == 1 and exp.fed.x_val is not None
    n_train = exp.dataset.train.num_instances
    assert exp.fed.clients[0].num_examples + len(exp.fed.x_val) == n_train
    assert all(m["message"]["loss"] == "bce" for m in exp.messages if m["direction"] == "down")
    assert {"GmAP", "GmAP_std", "GmAP_worst", "mAP"} <= set(res.summary["final"]) and "AmAP" not in res.summary["final"]
