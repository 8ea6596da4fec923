"""Who sees what. These tests inspect every message of real runs and check that
tampered algorithms or clients are stopped by the guard."""

import numpy as np
import pytest
import torch

from protocols.config_sections import SecureAggregationConfig
from secure_fed.algorithms.fedaws import FedAwS
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from secure_fed.errors import PrivacyViolation
from tests.conftest import small_config, small_plan

ALGOS = ["fedavg", "fedavg_fixed", "fedaws", "fedalc", "fedalc_fixed"]


def _fixed_steps(algo: str, n: int) -> list[str]:
    """fedalc_fixed's pre-training steps (a key of its own: the other algorithms refuse it)."""
    return [f"algorithm.fixed_steps={n}"] if algo == "fedalc_fixed" else []


def _logged_run(tmp_path, algo, *ov):
    exp = Experiment(
        small_plan(f"algorithm.name={algo}", "output.log_messages=true", "training.rounds=2", *_fixed_steps(algo, 5), *ov),
        run_dir=tmp_path,
    )
    W_per_round = []
    exp.setup()
    W_per_round.append(exp.W.clone())
    while exp.round < 2:
        exp.train_round()
        W_per_round.append(exp.W.clone())
    return exp, W_per_round


@pytest.mark.parametrize("algo", ALGOS)
def test_each_client_receives_only_its_own_class_row(tmp_path, algo):
    exp, Ws = _logged_run(tmp_path, algo)
    downs = [m for m in exp.messages if m["direction"] == "down" and "rows" in m["message"]]
    assert len(downs) == 2 * len(exp.fed.clients)
    for i, m in enumerate(downs):
        cid, msg = m["client"], m["message"]
        assert msg["row_ids"].tolist() == [cid]  # its own label only
        assert msg["rows"].shape == (1, exp.W.shape[1])
        rnd = i // len(exp.fed.clients)
        assert torch.equal(msg["rows"][0], Ws[rnd][cid])  # and that row is W's row for its label
        assert set(msg) <= {"theta", "rows", "row_ids", "train_rows", "loss"}


@pytest.mark.parametrize("algo", ALGOS)
def test_server_receives_no_features_and_no_foreign_rows(tmp_path, algo):
    exp, _ = _logged_run(tmp_path, algo)
    ups = [m for m in exp.messages if m["direction"] == "up"]
    feature_rows = {tuple(np.round(r, 5)) for r in exp.dataset.train.features.toarray()}
    theta_keys = set(exp.theta)
    for m in ups:
        msg, cid = m["message"], m["client"]
        assert set(msg) <= {"theta_delta", "rows_delta", "row_ids", "num_examples", "loss", "tokens", "label"}
        if "theta_delta" in msg:
            assert set(msg["theta_delta"]) == theta_keys
        if "rows_delta" in msg:
            assert msg["row_ids"].tolist() == [cid]
        if "label" in msg:
            assert msg["label"] == cid
            assert all(isinstance(t, bytes) and len(t) == 32 for t in msg["tokens"])
        for v in msg.values():  # no value anywhere equals a training feature vector
            if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[-1] == exp.dataset.num_features:
                assert not any(tuple(np.round(r, 5)) in feature_rows for r in v.reshape(-1, v.shape[-1]).numpy())
    if algo in ("fedavg_fixed", "fedalc_fixed"):
        assert not any("rows_delta" in m["message"] for m in ups)  # fixed W: rows are not even sent back


def test_client_data_holds_only_its_own_instances(tmp_path):
    exp = Experiment(small_plan("algorithm.name=fedalc"), run_dir=tmp_path)
    y = exp.dataset.train.labels.toarray()
    for c in exp.fed.clients:
        own = np.flatnonzero(y[:, c.client_id])
        assert c.num_examples == len(own)
        assert c.known_labels.tolist() == [c.client_id]
        assert (c.raw != exp.dataset.train.features[own]).nnz == 0


class LeakyFedAwS(FedAwS):
    """A broken algorithm that ships the whole class-embedding matrix to every client."""

    def downlink(self, theta, W, known_labels):
        payload = super().downlink(theta, W, known_labels)
        payload["rows"], payload["row_ids"] = W, torch.arange(W.shape[0])
        return payload


class SneakyFedAwS(FedAwS):
    """Hides W inside an extra key."""

    def downlink(self, theta, W, known_labels):
        return {**super().downlink(theta, W, known_labels), "extra": W}


@pytest.mark.parametrize("cls", [LeakyFedAwS, SneakyFedAwS])
def test_guard_stops_an_algorithm_that_sends_foreign_rows(tmp_path, cls):
    exp = Experiment(small_plan("algorithm.name=fedaws"), run_dir=tmp_path)
    exp.algorithm = cls(exp.plan.algorithm)
    with pytest.raises(PrivacyViolation):
        exp.train_round()


def test_guard_stops_a_client_that_uploads_features_or_lies_about_its_label(tmp_path):
    exp = Experiment(small_plan("algorithm.name=fedaws"), run_dir=tmp_path)
    client = exp.fed.clients[0]
    honest = exp.trainer.update
    payload = exp.algorithm.downlink(exp.theta, exp.W, client.known_labels)

    def leak(p, d):
        return {**honest(p, d, exp.local, torch.Generator().manual_seed(0)), "features": d.x}

    with pytest.raises(PrivacyViolation, match="not allowed"):
        exp._exchange(0, payload, leak)

    def other_row(p, d):
        r = honest(p, d, exp.local, torch.Generator().manual_seed(0))
        r["row_ids"] = torch.tensor([1])
        return r

    with pytest.raises(PrivacyViolation, match="do not belong"):
        exp._exchange(0, payload, other_row)
    # fedaws collects no label sets, so a token request is not even a message it may send
    with pytest.raises(PrivacyViolation, match="not allowed"):
        exp._exchange(0, {"tokenizer": "sha256"}, lambda p, d: {"tokens": [b"x" * 32], "label": 0})
    fedalc = Experiment(small_plan("algorithm.name=fedalc"), run_dir=tmp_path / "fedalc")
    with pytest.raises(PrivacyViolation, match="own label"):
        fedalc._exchange(0, {"tokenizer": "sha256"}, lambda p, d: {"tokens": [b"x" * 32], "label": 3})
    with pytest.raises(PrivacyViolation, match="shape"):
        bad_theta = {k: torch.zeros(1) for k in exp.theta}
        exp._exchange(0, {**payload, "theta": bad_theta}, honest)


# --------------------------------------------------------------------------------------------------------------
# The checks on the training path itself (remove any one of them in a scratch copy and one of these fails).
def test_guard_stops_a_leaky_client_on_the_training_path(tmp_path):
    """The client's own update is checked before any protocol layer, inside the round (not only at setup)."""
    exp = Experiment(small_plan("algorithm.name=fedaws"), run_dir=tmp_path)
    exp.setup()
    honest = exp.trainer.update

    def foreign_row(payload, data, hp, gen, privatizer=None, objective=None):
        reply = honest(payload, data, hp, gen, privatizer, objective)
        other = (int(data.client_id) + 1) % len(exp.fed.clients)
        return {**reply, "row_ids": torch.tensor([other])}

    exp.trainer.update = foreign_row
    with pytest.raises(PrivacyViolation, match="do not belong"):
        exp.train_round()

    def features(payload, data, hp, gen, privatizer=None, objective=None):
        return {**honest(payload, data, hp, gen, privatizer, objective), "features": data.x}

    exp.trainer.update = features
    with pytest.raises(PrivacyViolation, match="not allowed"):
        exp.train_round()


def test_every_update_the_server_receives_under_client_dp_is_clipped(tmp_path):
    """The wire (what the server receives) under client DP: each client's whole update has norm ≤ S."""
    S = 1e-3  # far below a client's real update norm, so an unclipped update would show
    cfg = small_config("algorithm.name=fedaws", 'protocols=["dp"]', "output.log_messages=true", "training.client_lr=0.5",
                       f'privacy.client={{"noise_multiplier": 1.0, "clip_norm": {S}}}', "training.rounds=1")  # fmt: skip
    exp = Experiment(build_plan(cfg), run_dir=tmp_path)
    exp.setup()
    exp.train_round()
    ups = [m["message"] for m in exp.messages if m["direction"] == "up" and "theta_delta" in m["message"]]
    assert len(ups) == len(exp.fed.clients)
    for msg in ups:
        sq = sum(float(t.double().pow(2).sum()) for t in msg["theta_delta"].values())
        sq += float(msg["rows_delta"].double().pow(2).sum()) if "rows_delta" in msg else 0.0
        assert sq**0.5 <= S * (1 + 1e-5)


def test_secure_aggregation_uplinks_are_masked_words_not_encoded_updates(tmp_path):
    """Under secure aggregation the server receives uniformly masked words: decoded as fixed-point they are
    astronomically large, where a real (clipped to ±R) update would decode to |x| ≤ R."""
    cfg = small_config("algorithm.name=fedaws", 'protocols=["secure_aggregation"]', "output.log_messages=true",
                       "training.rounds=1")  # fmt: skip
    exp = Experiment(build_plan(cfg), run_dir=tmp_path)
    exp.setup()
    exp.train_round()
    wires = [m["message"]["masked"] for m in exp.messages if m["direction"] == "up" and "masked" in m["message"]]
    assert len(wires) == len(exp.fed.clients)
    R, f = exp.plan.part(SecureAggregationConfig).clip_range, exp.plan.part(SecureAggregationConfig).frac_bits
    for y in wires:
        signed = y.astype(np.int64).astype(np.float64) / 2.0**f
        assert np.median(np.abs(signed)) > 1e3 * R  # an unmasked encoding would stay within ±R
        top = (y >> np.uint64(63)).astype(float)
        assert abs(top.mean() - 0.5) < 0.1  # the top bit of a uniform word is a fair coin
