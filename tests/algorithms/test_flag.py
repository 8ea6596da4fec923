"""FLAG (``secure_fed/algorithms/flag.py``): each client's weight is eq. 2 of its own labels, computed on the
client; the server averages Σ w_c Δ_c / Σ w_c; under a secure sum the weight travels only inside the summed vector.
Also the Asymmetric Loss (``asl``) that the FLAG paper trains with."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from secure_fed.algorithms.base import ClientData
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.algorithms.fedavg import FedAvg
from secure_fed.algorithms.flag import FLAG as FLAG_ALGO
from secure_fed.algorithms.flag import label_weight
from secure_fed.algorithms.losses import LOSSES
from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.engine.callbacks import Callback
from secure_fed.errors import ConfigError
from secure_fed.models.families import LinearHead
from tests.conftest import small_plan

FLAG = ["model.family=linear_head", "partition.name=dirichlet", "partition.num_clients=6", "algorithm.name=flag",
        "training.client_lr=0.1"]  # fmt: skip
#: the server adds the plain weighted mean (x ← x + 1·Δ), so θ shows the aggregate itself (FedAdam's first steps are
#: ≈ lr·sign(Δ), which would hide how the clients were weighted)
PLAIN_SERVER = ["training.server_optimizer.name=fedavg", "training.server_optimizer.lr=1.0"]

#: a client's label matrix: 4 instances × 4 labels, positives per label 3, 1, 1, 0
Y = [[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]
#: eq. 2 by hand: Σ_l n_l^α over the labels the client has (label 4 has no positive: it adds nothing, also at α = 0)
BY_HAND = {0.0: 3.0, 0.3: 3**0.3 + 1 + 1, 0.5: math.sqrt(3) + 2, 1.0: 5.0}

#: what a client sends under secure aggregation: each round's stage messages (public keys, signed adverts and
#: survivor-set signatures, sealed shares, the shares the server is entitled to) and its masked update
SECAGG_UP = {
    "c_pk",
    "s_pk",
    "secagg_sealed",
    "secagg_shares",
    "masked",
    "sign_pk",
    "pinned",
    "nbrs",
    "t",
    "sig",
    "secagg_signature",
}


class _Recorder(Callback):
    """The wire messages and the aggregate of every round, as the server gets them."""

    name = "test_recorder"

    def __init__(self):
        self.wires: dict[int, dict[int, dict]] = {}
        self.aggs: dict[int, object] = {}

    def on_uplink(self, round_idx, cid, wire):
        self.wires.setdefault(round_idx, {})[cid] = wire

    def on_aggregate(self, round_idx, cohort, agg):
        self.aggs[round_idx] = agg


def _run(tmp_path, *overrides):
    exp = Experiment(small_plan(*overrides), run_dir=tmp_path)
    rec = _Recorder()
    exp.callbacks.append(rec)
    res = exp.run(progress=False)
    assert res.summary["status"] == "completed"
    return exp, rec, res


def _eq2(exp, cid: int, alpha: float) -> float:
    """eq. 2 from the client's label matrix, in numpy (independent of ``label_weight``)."""
    n = exp.fed.clients[cid].pos.cpu().numpy().sum(axis=0).astype(np.float64)
    return float(sum(v**alpha for v in n if v > 0))


# --- eq. 2 ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("alpha", "want"), sorted(BY_HAND.items()))
def test_label_weight_is_eq2_by_hand(alpha, want):
    assert label_weight(torch.tensor(Y, dtype=torch.bool), alpha) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_the_client_computes_its_weight_from_its_own_labels_when_the_server_sends_alpha(alpha):
    torch.manual_seed(0)
    model = LinearHead().build(nn.Linear(5, 3), num_labels=4, embedding_dim=3)
    data = ClientData(client_id=0, x=torch.randn(4, 5), pos=torch.tensor(Y, dtype=torch.bool),
                      known_labels=torch.arange(4), raw=None, num_labels=4)  # fmt: skip
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    payload = {"theta": theta, "train_rows": False, "loss": "bce"}
    trainer, hp = LocalTrainer(model, LinearHead()), LocalTraining(batch_size=2)

    def train(p):
        return trainer.update(p, data, hp, torch.Generator().manual_seed(0))

    cfg = load_config(overrides=FLAG).algorithm
    assert "weight" not in FedAvg(cfg).client_update(payload, data, train)  # fedavg: no weight
    reply = FLAG_ALGO(cfg).client_update({**payload, "flag_alpha": alpha}, data, train)
    assert reply["weight"] == pytest.approx(BY_HAND[alpha], rel=1e-12)


# --- the server's aggregate ----------------------------------------------------------------------------------------


def test_server_aggregate_is_the_eq2_weighted_mean_of_the_client_deltas(tmp_path):
    alpha = 0.7
    exp, rec, _ = _run(tmp_path, *FLAG, "training.rounds=2", f"algorithm.flag_alpha={alpha}", "output.log_messages=true")
    downs = [m["message"] for m in exp.messages if m["direction"] == "down"]
    assert downs and all(m["flag_alpha"] == alpha for m in downs)
    for r in (0, 1):
        wires, agg = rec.wires[r], rec.aggs[r]
        assert sorted(wires) == list(range(len(exp.fed.clients)))
        w = {c: _eq2(exp, c, alpha) for c in wires}
        assert max(w.values()) > 1.5 * min(w.values())  # the clients' weights differ: not the uniform mean
        for c, wire in wires.items():
            assert wire["weight"] == pytest.approx(w[c], rel=1e-12)  # plaintext: the server sees each weight
        assert agg.weight_sum == pytest.approx(sum(w.values()), rel=1e-9)
        mean = agg.theta_mean()
        for n in exp.theta:
            deltas = {c: wire["theta_delta"][n].double().numpy() for c, wire in wires.items()}
            want = sum(w[c] * deltas[c] for c in wires) / sum(w.values())
            uniform = sum(deltas.values()) / len(deltas)
            got = mean[n].double().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7 * np.abs(want).max(), err_msg=n)
            assert np.abs(want - uniform).max() > 100 * np.abs(got - want).max()  # the check tells FLAG from FedAvg


# --- secure sums ---------------------------------------------------------------------------------------------------


def test_under_secure_aggregation_the_server_sees_no_weight_and_gets_the_plaintext_result(tmp_path):
    ov = [*FLAG, *PLAIN_SERVER, "training.rounds=2"]
    plain, _, _ = _run(tmp_path / "plain", *ov)
    fedavg, _, _ = _run(tmp_path / "fedavg", *ov, "algorithm.name=fedavg")
    sec, rec, _ = _run(tmp_path / "sec", *ov, 'protocols=["secure_aggregation"]', "output.log_messages=true")
    for n in plain.theta:
        err = (plain.theta[n] - sec.theta[n]).norm() / plain.theta[n].norm()
        assert err < 1e-5, (n, float(err))
        assert (plain.theta[n] - fedavg.theta[n]).norm() / plain.theta[n].norm() > 100 * err  # FLAG's weights show
    every_up = [m for m in sec.messages if m["direction"] == "up"]
    assert all(set(m["message"]) <= SECAGG_UP for m in every_up)  # stage messages and masked words, nothing else
    ups = [m for m in every_up if "masked" in m["message"]]
    clients = len(sec.fed.clients)
    assert len(ups) == 2 * clients and all(set(m["message"]) == {"masked"} for m in ups)  # no weight, no delta
    layer = sec.stack.layers[0]
    w_slot = layer.layout.segments()["meta"].start
    for m in ups:  # the weight's slot of a masked vector is not the client's weight
        w = _eq2(sec, m["client"], 0.3)
        assert abs(layer.codec.decode_sum(m["message"]["masked"])[w_slot] - w) > 1e-3
    total = sum(_eq2(sec, c, 0.3) for c in range(clients))
    for r in (0, 1):  # ... but the unmasked sum holds Σ_c w_c: the weights travelled inside the summed vector
        assert rec.aggs[r].weight_sum == pytest.approx(total, rel=1e-6) and rec.aggs[r].num_clients == clients


def test_flag_runs_under_ckks_with_epsilon_inf_and_the_weights_inside_the_encrypted_sum(tmp_path):
    ov = [*FLAG, *PLAIN_SERVER, "training.rounds=2"]
    plain, _, _ = _run(tmp_path / "plain", *ov)
    enc, rec, res = _run(tmp_path / "ckks", *ov, 'protocols=["ckks"]', "output.log_messages=true")
    assert res.summary["privacy"]["epsilon"] == "inf"
    assert not any("weight" in m["message"] or "theta_delta" in m["message"] for m in enc.messages if m["direction"] == "up")
    total = sum(_eq2(enc, c, 0.3) for c in range(len(enc.fed.clients)))
    assert all(rec.aggs[r].weight_sum == pytest.approx(total, rel=1e-5) for r in (0, 1))
    for n in plain.theta:
        assert (plain.theta[n] - enc.theta[n]).norm() / plain.theta[n].norm() < 1e-3, n


# --- client-level DP: bounded weights ------------------------------------------------------------------------------


def _update_norm(wire) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in wire["theta_delta"].values()))


def test_under_client_dp_each_update_is_clipped_then_scaled_by_its_capped_weight_and_reports_weight_1(tmp_path):
    """S small enough that every update is clipped (norm = S), and W̄ between the clients' weights: a client's wire
    update has norm S·min(w, W̄)/W̄ with w from its own labels (numpy, not ``label_weight``), and weight 1."""
    clip = 1e-3
    probe = Experiment(small_plan(*FLAG), run_dir=tmp_path / "probe")
    w = {c: _eq2(probe, c, 0.3) for c in range(len(probe.fed.clients))}
    cap = sorted(w.values())[len(w) // 2]  # the median: some clients above the cap, some below
    assert max(w.values()) > cap > min(w.values())
    ov = [*FLAG, "training.rounds=2", 'protocols=["dp"]', f'privacy.client={{"noise_multiplier": 0.5, "clip_norm": {clip}, '
          f'"weight_cap": {cap}}}']  # fmt: skip
    exp, rec, res = _run(tmp_path / "dp", *ov)
    for r in (0, 1):
        for c, wire in rec.wires[r].items():
            assert wire["weight"] == 1.0  # no weight leaves the client outside the noised update
            assert _update_norm(wire) == pytest.approx(clip * min(w[c], cap) / cap, rel=1e-4), (r, c)
        assert rec.aggs[r].weight_sum == pytest.approx(len(rec.wires[r]))
    unit = res.summary["privacy"]["units"]["client"]
    assert math.isfinite(float(unit["epsilon"])) and unit["sensitivity"] == clip and "W̄" in unit["sensitivity_note"]


def test_flag_runs_under_dp_and_secure_aggregation_with_a_tracked_epsilon_and_no_weight_in_the_servers_view(tmp_path):
    ov = [*FLAG, "training.rounds=2", 'protocols=["dp", "secure_aggregation"]', "output.log_messages=true",
          'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5, "weight_cap": 20, "noise": "clients"}']  # fmt: skip
    exp, rec, res = _run(tmp_path, *ov)
    eps = [float(h["privacy"]["epsilon"]) for h in res.history]
    assert 0 < eps[0] < eps[1] < math.inf  # tracked round by round
    every_up = [m for m in exp.messages if m["direction"] == "up"]
    assert all(set(m["message"]) <= SECAGG_UP for m in every_up)
    ups = [m for m in every_up if "masked" in m["message"]]
    assert ups and all(set(m["message"]) == {"masked"} for m in ups)
    for r in (0, 1):  # the sum's weight slot counts clients: each reported weight 1, no eq. 2 weight in the view
        assert rec.aggs[r].weight_sum == pytest.approx(len(exp.fed.clients), abs=1e-6)


def test_weight_cap_is_refused_where_no_client_reports_a_weight():
    with pytest.raises(ConfigError, match="weight_cap applies to"):
        load_config(overrides=[*FLAG, "algorithm.name=fedavg", 'protocols=["dp"]',
                               'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0, "weight_cap": 3}'])  # fmt: skip


# --- learning on CMDA clients --------------------------------------------------------------------------------------


def _label_frequency_map(exp) -> float:
    """mAP (percent) of scoring every test instance by the labels' frequencies: each label's AP = its prevalence."""
    y = exp.fed.y_test.toarray()
    return float(100 * y.mean(0)[y.sum(0) > 0].mean())


@pytest.mark.parametrize("loss", ["bce", "asl"])
def test_flag_learns_on_cmda_clients(tmp_path, loss):
    ov = ["model.family=linear_head", "partition.name=cmda", "partition.num_clients=6", "partition.kmodes_inits=2",
          "algorithm.name=flag", f"algorithm.loss={loss}", "training.client_lr=0.1", "training.rounds=20",
          "evaluation.every=10", "output.log_messages=true"]  # fmt: skip
    exp, _, res = _run(tmp_path, *ov)
    assert all(m["message"]["loss"] == loss for m in exp.messages if m["direction"] == "down")
    baseline = _label_frequency_map(exp)
    assert res.summary["final"]["mAP"] > baseline + 15, (res.summary["final"]["mAP"], baseline)


# --- configuration -------------------------------------------------------------------------------------------------


def test_flag_alpha_defaults_to_the_papers_and_is_its_own_field():
    cfg = load_config(overrides=FLAG)
    assert cfg.algorithm.flag_alpha == 0.3 and "alpha" not in cfg.algorithm.model_fields  # FedALC-fixed's α is not flag's
    with pytest.raises(ConfigError, match="algorithm.alpha: unknown key"):
        load_config(overrides=[*FLAG, "algorithm.alpha=0.5"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['protocols=["dp"]', 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}'], "set privacy.client.weight_cap"),
        (['protocols=["dp"]', 'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.1}'], "does not have"),
        (['protocols=["keyed_hashing"]'], "keyed_hashing protects label-set collection"),
        (["training.aggregation=num_examples"], "aggregation must stay uniform"),
        (["algorithm.flag_alpha=-0.1"], "flag_alpha"),
    ],
)
def test_flag_refuses_what_it_cannot_run(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[*FLAG, *overrides])


def test_asl_needs_logits():
    with pytest.raises(ConfigError, match="asl needs logits"):
        load_config(overrides=["algorithm.name=fedavg", "algorithm.loss=asl"])


# --- Asymmetric Loss -----------------------------------------------------------------------------------------------


def test_asl_matches_a_hand_computed_2x2_example():
    """γ+ = 0, γ− = 4, clip 0.05, mean over the four (instance, label) pairs. By hand, with p = σ(z):
    (0,0) positive, z = 2:    −log σ(2) = log(1 + e^−2)                      = 0.1269280
    (0,1) negative, z = −4:   p = 0.0180 ≤ 0.05, so p_m = 0                  = 0
    (1,0) negative, z = 1:    p_m = σ(1) − 0.05 = 0.6810586; −p_m⁴·log(1 − p_m) = 0.2458602
    (1,1) positive, z = 0.5:  log(1 + e^−0.5)                                = 0.4740770
    """
    z = torch.tensor([[2.0, -4.0], [1.0, 0.5]], requires_grad=True)
    y = torch.tensor([[1, 0], [0, 1]], dtype=torch.bool)
    loss = LOSSES["asl"](z, y)
    assert float(loss.detach()) == pytest.approx((0.1269280 + 0 + 0.2458602 + 0.4740770) / 4, abs=1e-6)
    loss.backward()
    assert z.grad[0, 1] == 0  # a negative below the clip is ignored
    assert torch.isfinite(z.grad).all()


def test_asl_without_focusing_or_clip_is_bce():
    z, y = torch.randn(5, 3), torch.rand(5, 3) > 0.5
    assert float(LOSSES["asl"](z, y, 0.0, 0.0, 0.0)) == pytest.approx(float(LOSSES["bce"](z, y)), rel=1e-5)


# --- the paper's centralised baseline --------------------------------------------------------------------------------


def test_the_oracle_is_the_linear_head_centralised_baseline(tmp_path):
    """One client with all training data and every label, the same linear-head model (the paper's TResNet (G))."""
    ov = ["model.family=linear_head", "algorithm.name=oracle", "algorithm.loss=asl", *PLAIN_SERVER, "training.client_lr=0.1",
          "training.rounds=6", "evaluation.every=2", "output.log_messages=true"]  # fmt: skip
    exp, _, res = _run(tmp_path, *ov)
    assert exp.W is None and len(exp.fed.clients) == 1 and exp.fed.clients[0].known_labels.tolist() == list(range(8))
    assert all(m["message"]["loss"] == "asl" for m in exp.messages if m["direction"] == "down")
    assert res.summary["final"]["mAP"] > _label_frequency_map(exp) + 15
