"""The general multi-label setting on Flower: FLAG (CMDA clients, eq. 2's weight) and FedLGT (C-Tran with label
embeddings from the public names) give the in-process run's model, metrics and client-side evaluation (AmAP, WmAP:
each node scores its clients' own models on their own test rows and reports the mAP beside the reply, in runs
without protocol layers)."""

from __future__ import annotations

import pytest
import torch

from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError, PrivacyViolation
from tests.conftest import small_plan
from tests.engine.flower.nodes import run_in_process, run_recorded

GENERAL = ["model.family=linear_head", "partition.name=cmda", "partition.num_clients=5", "partition.kmodes_inits=2",
           "training.client_lr=0.1", "training.rounds=2", "evaluation.every=1", "flower.num_supernodes=3"]  # fmt: skip
CASES = {
    "flag": [*GENERAL, "algorithm.name=flag", "algorithm.loss=asl", "output.log_messages=true"],
    "fedlgt": ["algorithm.name=fedlgt", "model.family=ctran", "model.embedding_dim=16", "partition.name=iid",
               "model.ctran={layers: 1, heads: 2, token_size: 4}", "partition.num_clients=3", "training.rounds=2",
               "training.client_optimizer=adam", "training.client_lr=0.003", "flower.num_supernodes=2"],
}  # fmt: skip
CLIENT_METRICS = ("AmAP", "AmAP_std", "WmAP")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_general_setting_on_flower_equals_in_process(case, tmp_path):
    overrides = CASES[case]
    fl, flower, _ = run_recorded(overrides, tmp_path)
    local_exp, local = run_in_process(overrides, tmp_path / "local")
    assert flower.summary["status"] == "completed"
    for n, t in local_exp.theta.items():
        assert torch.allclose(fl.theta[n], t, atol=1e-5, rtol=0), n
    assert set(flower.summary["final"]) == set(local.summary["final"])
    for k, v in local.summary["final"].items():
        assert flower.summary["final"][k] == pytest.approx(v, abs=1e-5), k
    # every round's client-side evaluation, from the nodes' reports (local training, whose clients' own models live
    # in their nodes' state, is compared the same way in test_resume_on_flower.py)
    evaluated = [h for h in local.history if "AmAP" in h]
    assert evaluated and len(evaluated) == len([h for h in flower.history if "AmAP" in h])
    for f, h in zip(flower.history, local.history, strict=True):
        for k in CLIENT_METRICS:
            assert f.get(k) == pytest.approx(h.get(k), abs=1e-5), (h["round"], k)
    if fl.messages is not None:  # what the server learned from the reports is in its recorded view
        reports = [m for m in fl.messages if m["direction"] == "up" and "report" in m["message"]]
        assert len(reports) == 2 * len(fl.fed.clients)  # one per client and evaluated round
        assert all(set(m["message"]["report"]) == {"client_evaluation"} for m in reports)


def test_a_client_evaluation_report_is_refused_under_dp(tmp_path):
    """With DP a client's own model's mAP is a statistic no mechanism protects: a node does not report it, and the
    server refuses a report that arrives anyway; a callback that takes no reports refuses every report."""
    dp = ["protocols=[dp]", "privacy.client={noise_multiplier: 1.0, clip_norm: 1.0, weight_cap: 8.0}"]
    exp = Experiment(small_plan(*CASES["flag"], *dp), run_dir=tmp_path / "dp")
    ev = exp.callback("client_evaluation")
    ev.maps[0] = 50.0
    assert ev.client_report(exp.context(), 0) == {}  # the node keeps it
    assert ev.ctx is not None and ev.ctx.records is exp.records  # active in this run: the refusal is the layer's
    with pytest.raises(PrivacyViolation, match="client 3's client-evaluation report"):
        ev.on_client_report(exp.context(), 3, {"mAP": 50.0})
    plain = Experiment(small_plan(*CASES["flag"]), run_dir=tmp_path / "plain")
    ev = plain.callback("client_evaluation")
    with pytest.raises(PrivacyViolation, match="not allowed"):
        ev.on_client_report(plain.context(), 1, {"mAP": 1.0, "loss": 0.3})  # only the mAP
    with pytest.raises(PrivacyViolation, match="takes none"):
        plain.callback("evaluation").on_client_report(plain.context(), 1, {"mAP": 1.0})


def test_a_report_for_a_callback_that_takes_none_stops_the_run():
    """The executor hands a node's report only to a server callback that takes reports from remote clients."""
    from secure_fed.engine.flower.executor import FlowerError, FlowerExecutor

    exp = Experiment(small_plan(*CASES["flag"]), run_dir="/nonexistent")
    ex = FlowerExecutor(None, exp.context(), max_in_flight=1, timeout_s=1)
    with pytest.raises(PrivacyViolation, match="'evaluation', which takes no reports"):
        ex._take_reports(2, '{"evaluation": {"mAP": 1.0}}')
    with pytest.raises(FlowerError, match="not a mapping of names to numbers"):
        ex._take_reports(2, '{"client_evaluation": {"mAP": "high"}}')
    ex._take_reports(2, '{"client_evaluation": {"mAP": 41.5}}')
    assert exp.callback("client_evaluation").maps == {2: 41.5}


def test_centralised_training_is_refused_on_flower():
    with pytest.raises(ConfigError, match="trains one centralised model on the pooled data"):
        load_config(None, ["backend=flower", *GENERAL, "algorithm.name=centralised"])
