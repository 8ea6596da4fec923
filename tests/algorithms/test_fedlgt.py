"""FedC-Tran and FedLGT: ULE stays on the clients (identical everywhere, in no message), CA-MLE's settings are the
only new downlink keys, and FedLGT runs under client-level DP with secure aggregation with a tracked ε."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fed.config import load_config, load_plan
from secure_fed.engine import Experiment
from secure_fed.engine.builders import build_model
from secure_fed.errors import ConfigError
from secure_fed.models.text_encoder import load_text_encoder, prompts
from tests.conftest import SMALL

#: dense synthetic rows (no text network), 3 iid clients, a small C-Tran
LGT = [
    *SMALL,
    "algorithm.name=fedlgt",
    "model.family=ctran",
    "model.embedding_dim=16",
    "model.ctran={layers: 1, heads: 2, token_size: 4}",
    "partition.name=iid",
    "partition.num_clients=3",
    "training.rounds=2",
    "training.client_optimizer=adam",
    "training.client_lr=0.003",
    "output.log_messages=true",
]


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


@pytest.fixture(scope="module")
def encoder():
    return load_text_encoder("all-MiniLM-L6-v2")


def test_ule_is_the_same_on_every_client_and_in_no_message(tmp_path, encoder):
    exp = Experiment(load_plan(overrides=LGT), run_dir=tmp_path / "run")
    exp.run(progress=False)
    names = list(exp.dataset.label_names)
    # independent computation: the encoder on the prompts and the two state words
    labels = encoder.encode(prompts(names, "The photo contains [CLASS]."))
    states = encoder.encode(["positive", "negative"])
    for model in (exp.worker, exp.encoder):
        np.testing.assert_allclose(model.text_labels.numpy(), labels, atol=1e-5)
        np.testing.assert_allclose(model.text_states.numpy(), states, atol=1e-5)
    # a client in another process builds its own from the names (no cache): the same embeddings
    fresh = build_model(exp.plan, exp.dataset, cache_dir=None)
    assert torch.equal(fresh.text_labels, exp.worker.text_labels) and torch.equal(fresh.text_states, exp.worker.text_states)
    assert (tmp_path / "run" / "cache").is_dir() and len(list((tmp_path / "run" / "cache").glob("ule-*.npz"))) == 1
    # never in θ, so never in an update; no message holds a tensor of the text embeddings' width
    assert not any("text_labels" in n or "text_states" in n for n in exp.theta)
    ups = [m["message"] for m in exp.messages if m["direction"] == "up"]
    downs = [m["message"] for m in exp.messages if m["direction"] == "down"]
    assert len(ups) == 6 and len(downs) == 6
    for msg in ups:
        assert set(msg) == {"theta_delta", "num_examples", "loss"}
        assert set(msg["theta_delta"]) == set(exp.theta)
    for msg in ups + downs:
        for t in _tensors(msg):
            assert tuple(t.shape) not in {(len(names), encoder.dim), (2, encoder.dim)}, t.shape
    assert {k for m in downs for k in m} == {"theta", "train_rows", "loss", "ca_mle_tau", "ca_mle_epsilon", "ca_mle_random_mask"}
    assert downs[0]["ca_mle_tau"] == 0.5 and downs[0]["ca_mle_epsilon"] == 0.02


def test_fedctran_and_the_ablation_switches(tmp_path):
    off = [*LGT, "algorithm.ule=false", "algorithm.ca_mle=false"]
    lgt_off = Experiment(load_plan(overrides=off), run_dir=tmp_path / "off")
    ctran = Experiment(load_plan(overrides=[*LGT, "algorithm.name=fedctran"]), run_dir=tmp_path / "ctran")
    assert "label_embedding" in dict(lgt_off.encoder.named_parameters())  # learned label embeddings, as C-Tran
    r_off, r_ctran = lgt_off.run(progress=False), ctran.run(progress=False)
    assert r_off.summary["final"]["mAP"] == r_ctran.summary["final"]["mAP"]  # both switches off = FedC-Tran
    downs = [m["message"] for m in ctran.messages if m["direction"] == "down"]
    assert not any("ca_mle_tau" in m for m in downs)


def test_fedlgt_runs_under_client_dp_with_secure_aggregation_and_tracks_epsilon(tmp_path):
    ov = [*LGT, 'protocols=["dp", "secure_aggregation"]',
          'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0, "noise": "clients"}']  # fmt: skip
    exp = Experiment(load_plan(overrides=ov), run_dir=tmp_path / "dp")
    res = exp.run(progress=False)
    eps = res.summary["privacy"]["epsilon"]
    assert res.summary["status"] == "completed" and 0 < eps < float("inf")
    ups = [m["message"] for m in exp.messages if m["direction"] == "up"]
    assert ups and not any("theta_delta" in m for m in ups)  # masked sums only


def test_fedlgt_runs_with_dp_sgd_in_client_training_under_secure_aggregation(tmp_path):
    """Instance-level DP-SGD inside FedLGT's training (label states and CA-MLE masks drawn outside the per-sample
    gradients): the run completes within its target, client training is covered, and one instance sits on one
    client (iid), so each round counts exactly E·round(1/q) steps."""
    ov = [*LGT, 'protocols=["dp", "secure_aggregation"]', 'privacy.local={"target_epsilon": 3, "batch_sample_rate": 0.5}']
    res = Experiment(load_plan(overrides=ov), run_dir=tmp_path / "dp").run(progress=False)
    unit = res.summary["privacy"]["units"]["instance"]
    assert res.summary["status"] == "completed" and 0 < unit["epsilon"] <= 3
    assert unit["steps"] == 2 * 2  # 2 rounds × (1 epoch × 2 steps) × 1 copy
    assert not any("client training" in x for x in unit["not_covered"])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algorithm.name=fedlgt", "model.family=linear_head"], "set model.family: ctran"),
        (["model.family=ctran", "model.embedding_dim=10", "model.ctran.heads=4"], "multiple of model.ctran.heads"),
        (["model.label_prompt=a photo"], "must contain [CLASS]"),
        (["model.family=ctran", "algorithm.name=fedalc"], "keeps no per-label rows"),
    ],
)
def test_config_mistakes_are_one_line(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        load_config(overrides=[*SMALL, "partition.name=iid", *overrides])


def test_resume_is_exact_with_dropout_and_ca_mle(tmp_path):
    """C-Tran's dropout draws from a generator seeded by the client's own: a resumed run equals an uninterrupted
    one, whatever else the process drew from torch's global generator in between."""
    ov = [*LGT, "training.rounds=4", "output.checkpoint_every=2", "output.log_messages=false"]
    a = Experiment(load_plan(overrides=ov), run_dir=tmp_path / "a")
    a.run(progress=False)
    c = Experiment(load_plan(overrides=[*ov, "training.rounds=2"]), run_dir=tmp_path / "c")
    c.run(progress=False)
    d = Experiment(load_plan(overrides=ov), run_dir=tmp_path / "c")
    assert d.resume() and d.round == 2
    torch.rand(1000)  # the process does other work between building and running
    d.run(progress=False)
    assert all(torch.equal(a.theta[k], d.theta[k]) for k in a.theta)


def test_centralised_ctran_trains_with_label_masks(tmp_path):
    exp = Experiment(load_plan(overrides=[*LGT, "algorithm.name=centralised", "output.log_messages=false"]),
                     run_dir=tmp_path / "central")  # fmt: skip
    res = exp.run(progress=False)
    assert res.summary["status"] == "completed" and res.summary["final"]["mAP"] > 0


def _training_states(tmp_path, name, *overrides):
    """The share of unknown labels in the states local training gives the model (1 round)."""
    exp = Experiment(load_plan(overrides=[*LGT, "training.rounds=1", "output.log_messages=false", *overrides]),
                     run_dir=tmp_path / name)  # fmt: skip
    states = []
    exp.worker.register_forward_hook(lambda m, a, out: states.append(a[1]) if len(a) > 1 else None)
    exp.run(progress=False)
    s = torch.cat(states)
    return float((s == 0).float().mean())


def test_the_trainer_applies_ca_mle_in_both_readings(tmp_path):
    """ε = 0.49 makes (almost) every label uncertain, so (almost) every label is unknown; without the random mask
    and with ε = 0 none is; without CA-MLE the label mask alone leaves about (1/4 + 1)/2 of the labels unknown."""
    plain = _training_states(tmp_path, "plain", "algorithm.ca_mle=false")
    wide = _training_states(tmp_path, "wide", "algorithm.ca_mle_epsilon=0.49")
    none = _training_states(tmp_path, "none", "algorithm.ca_mle_epsilon=0.0", "algorithm.ca_mle_random_mask=false")
    assert 0.5 < plain < 0.75, plain
    assert wide > 0.97, wide
    assert none < 0.01, none
