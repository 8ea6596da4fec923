"""Model families (``secure_fed/models/families.py``): f = W·g_θ is one family, not the engine's assumption.
A family without a row table (``linear_head``) trains end to end with FedAvg, under secure aggregation and DP,
and no client ever receives a row table."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from secure_fed.models.families import CosineEmbedding, LinearHead, model_family
from tests.conftest import small_plan

LINEAR = ["model.family=linear_head", "partition.name=iid", "partition.num_clients=8", "algorithm.name=fedavg",
          "training.client_lr=0.1"]  # fmt: skip


def test_embedding_scores_are_cosines():
    torch.manual_seed(0)
    enc = nn.Linear(5, 3)
    W, x = torch.randn(4, 3), torch.randn(6, 5)
    got = CosineEmbedding().scores(enc, W, x).detach().numpy()
    z = (x @ enc.weight.T + enc.bias).detach().numpy()
    w = W.numpy()
    want = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_linear_head_scores_are_logits_of_the_head_on_relu_features():
    torch.manual_seed(0)
    model = LinearHead().build(nn.Linear(5, 3), num_labels=4, embedding_dim=3)
    x = torch.randn(6, 5)
    p = {n: t.detach().numpy() for n, t in model.named_parameters()}
    h = np.maximum(x.numpy() @ p["encoder.weight"].T + p["encoder.bias"], 0.0)
    want = h @ p["head.weight"].T + p["head.bias"]
    np.testing.assert_allclose(LinearHead().scores(model, None, x).detach().numpy(), want, rtol=1e-5, atol=1e-6)
    assert LinearHead().init_rows(4, 3, generator=torch.Generator()) is None


def test_unknown_family_is_a_one_line_error():
    with pytest.raises(ConfigError, match="model family"):
        model_family("resnet9000")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.family=linear_head", "algorithm.name=fedalc"], "keeps no per-label rows"),
        (["model.family=linear_head", "algorithm.name=fedavg"], "full label vectors"),
        (["model.family=linear_head", "partition.name=iid", "algorithm.name=fedavg", "algorithm.loss=positive"], "use bce"),
        (["algorithm.loss=bce"], "linear_head"),
        (
            [
                "model.family=linear_head",
                "partition.name=iid",
                "algorithm.name=fedavg",
                "evaluation.remove_shared_direction=true",
            ],  # fmt: skip
            "remove_shared_direction acts on the class rows",
        ),
        (["algorithm.name=label_prior", "evaluation.remove_shared_direction=true"], "label_prior never trains"),
    ],
)
def test_inconsistent_family_settings_are_refused_by_validate(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides)


def _label_frequency_map(exp) -> float:
    """mAP (percent) of the baseline that scores every test instance by the labels' training frequencies:
    constant scores per label give each label's AP = its test prevalence."""
    y = exp.fed.y_test.toarray()
    present = y.sum(0) > 0
    return float(100 * y.mean(0)[present].mean())


def test_linear_head_fedavg_learns_and_clients_receive_no_row_table(tmp_path):
    exp = Experiment(small_plan(*LINEAR, "training.rounds=20", "evaluation.every=10", "output.log_messages=true"),
                     run_dir=tmp_path)  # fmt: skip
    res = exp.run(progress=False)
    assert exp.W is None and res.summary["status"] == "completed"
    baseline = _label_frequency_map(exp)
    assert res.summary["final"]["mAP"] > baseline + 15, (res.summary["final"]["mAP"], baseline)
    downs = [m["message"] for m in exp.messages if m["direction"] == "down"]
    assert downs and all(set(m) == {"theta", "train_rows", "loss"} and m["loss"] == "bce" for m in downs)
    assert set(downs[0]["theta"]) == {n for n, _ in exp.encoder.named_parameters()} >= {"head.weight", "head.bias"}
    assert res.summary["privacy"]["epsilon"] == "inf"


def test_linear_head_runs_under_dp_and_secure_aggregation_with_a_tracked_epsilon(tmp_path):
    dp = ['protocols=["dp", "secure_aggregation"]', 'privacy.client={"noise_multiplier": 0.8, "clip_norm": 1.0}',
          "privacy.noise_seed=3", "output.log_messages=true"]  # fmt: skip
    exp = Experiment(small_plan(*LINEAR, *dp), run_dir=tmp_path)
    res = exp.run(progress=False)
    eps = res.summary["privacy"]["epsilon"]
    assert res.summary["status"] == "completed" and isinstance(eps, float) and 0 < eps < float("inf")
    ups = [m["message"] for m in exp.messages if m["direction"] == "up" and "masked" in m["message"]]
    assert len(ups) == 4 * len(exp.fed.clients)  # every update crossed the wire masked, never in the clear
    assert all("theta_delta" not in m for m in ups)
