"""DP-SGD inside client training (``privacy.local``): per-sample clipping, noise and Poisson batches from the client's
secret, the trainer's use of them, and the instance unit's ledger composed over both mechanisms, checked against a
fresh Opacus accountant run over the same (σ, q, steps) history."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from protocols.dp.accountant import RDP_ORDERS
from protocols.dp.local_dpsgd import LocalDPSGD, steps_per_epoch
from protocols.randomness import SecretStream
from secure_fed.config import load_plan
from secure_fed.engine import Experiment
from tests.conftest import SMALL

LOCAL = [
    "algorithm.name=fedaws",
    "protocols=[dp]",
    "privacy.local={clip_norm: 1.0, target_epsilon: 8, batch_sample_rate: 0.25, max_labels_per_instance: 8}",
]


def _priv(sigma=0.0, clip=1.0, q=0.5, stream=None, divisor=1.0):
    return LocalDPSGD(clip_norm=clip, noise_multiplier=sigma, sample_rate=q, divisor=divisor,
                      stream=stream or SecretStream.fresh(), label="r0")  # fmt: skip


def test_clip_sum_clips_each_sample_over_all_its_tensors():
    torch.manual_seed(0)
    a, b = torch.randn(7, 3, 4) * 5, torch.randn(7, 2) * 5
    a[0], b[0] = 1e-3, 1e-3  # one small sample: left as is
    got = _priv(clip=1.0).clip_sum({"a": a, "b": b})
    want_a, want_b = torch.zeros(3, 4), torch.zeros(2)
    for i in range(7):  # independent: each sample's vector, its norm, min(1, C/‖g‖)
        v = torch.cat([a[i].flatten(), b[i]])
        f = min(1.0, 1.0 / float(v.norm()))
        want_a += f * a[i]
        want_b += f * b[i]
    # float64 sums of the float32 inputs, against float32 references; the clip keeps a 2^-20 margin (exact_sums)
    torch.testing.assert_close(got["a"], want_a, check_dtype=False, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["b"], want_b, check_dtype=False, rtol=1e-5, atol=1e-6)


def test_finish_adds_noise_of_std_sigma_c_over_the_public_divisor_from_the_stream():
    sums = {"w": torch.zeros(200, 100), "b": torch.zeros(500)}
    sigma, clip, B = 2.0, 0.5, 16.0
    s = SecretStream.fresh()
    out = _priv(sigma=sigma, clip=clip, stream=s, divisor=B).finish(sums, "e0 s0")
    z = torch.cat([o.flatten() for o in out.values()]) * B
    assert abs(float(z.std()) - sigma * clip) < 0.03 * sigma * clip  # 6σ of the std over 20,500 draws
    # the noise is the stream's draw for this step's label: the same key and label redraw it, another key does not
    again = _priv(sigma=sigma, clip=clip, divisor=B, stream=SecretStream.from_state_dict(s.state_dict())).finish(sums, "e0 s0")
    for n in sums:
        torch.testing.assert_close(again[n], out[n])
    other = _priv(sigma=sigma, clip=clip, divisor=B).finish(sums, "e0 s0")
    assert not torch.allclose(other["w"], out["w"])
    # without noise the step is the clipped sum over the public divisor, whatever the client's n
    plain = _priv(sigma=0.0, divisor=B).finish({"x": torch.full((3,), 5.0)}, "x")
    torch.testing.assert_close(plain["x"], torch.full((3,), 5.0 / B))


def test_poisson_batches_take_each_example_with_rate_q_from_the_secret():
    p = _priv(q=0.2)
    sizes = [len(p.batch(1000, f"e0 s{i}")) for i in range(50)]
    assert abs(np.mean(sizes) - 200) < 10 and np.std(sizes) > 5  # Poisson: the batch size varies
    assert steps_per_epoch(0.2) == 5 and steps_per_epoch(0.3) == 3 and steps_per_epoch(1.0) == 1
    # two clients (two secrets) draw different batches for the same step
    assert not torch.equal(_priv(q=0.5).batch(100, "e0 s0"), _priv(q=0.5).batch(100, "e0 s0"))


def _update_norm(reply):
    sq = sum(float(t.double().pow(2).sum()) for t in reply["theta_delta"].values())
    if "rows_delta" in reply:
        sq += float(reply["rows_delta"].double().pow(2).sum())
    return math.sqrt(sq)


def test_the_trainer_takes_its_gradient_from_the_privatizer(tmp_path):
    """Plain SGD from the privatizer's clipped sums: each step moves (θ, rows) by at most lr·|batch|·C/B, so with a
    tiny C the whole update is tiny; the same client without clipping moves far more."""
    exp = Experiment(load_plan(overrides=[*SMALL, *LOCAL]), run_dir=tmp_path / "run")
    client = exp.fed.clients[0]
    payload = exp.algorithm.downlink(exp.theta, exp.W, client.known_labels)
    q, clip, B = 0.5, 1e-4, 32.0
    priv = _priv(sigma=0.0, clip=clip, q=q, divisor=B)
    # the batch sizes, redrawn independently from the same secret (uniform draws below q)
    batches = [int((priv.stream.uniform(client.num_examples, f"r0 e0 s{s} sample") < q).sum()) for s in range(2)]
    reply = exp.trainer.update(payload, client, exp.local, torch.Generator().manual_seed(0), priv)
    bound = exp.local.lr * sum(batches) * clip / B
    assert 0 < _update_norm(reply) <= bound * 1.001
    loose = _priv(sigma=0.0, clip=1e6, q=q, divisor=B)
    assert _update_norm(exp.trainer.update(payload, client, exp.local, torch.Generator().manual_seed(0), loose)) > 20 * bound


def test_the_trainers_noise_has_std_lr_sigma_c_over_b_per_step(tmp_path):
    """The noise reaches the update: the same client, batches and generator with σ = 3 and σ = 0 differ by
    N(0, steps·(lr·σ·C/B)²) per coordinate of the plain-SGD update (first steps, before the noise feeds back)."""
    exp = Experiment(load_plan(overrides=[*SMALL, *LOCAL, "model.hidden_dims=[256]"]), run_dir=tmp_path / "run")
    client = exp.fed.clients[0]
    payload = exp.algorithm.downlink(exp.theta, exp.W, client.known_labels)
    sigma, clip, B, q = 3.0, 1e-3, 32.0, 0.5  # a small C: the two runs' gradients differ only at second order
    key = SecretStream.fresh().state_dict()
    runs = []
    for s in (sigma, 0.0):
        priv = _priv(sigma=s, clip=clip, q=q, divisor=B, stream=SecretStream.from_state_dict(key))
        runs.append(exp.trainer.update(payload, client, exp.local, torch.Generator().manual_seed(0), priv))
    diff = torch.cat([(runs[0]["theta_delta"][n] - runs[1]["theta_delta"][n]).flatten() for n in runs[0]["theta_delta"]])
    want = exp.local.lr * sigma * clip / B * math.sqrt(2)  # 2 steps an epoch at q = 0.5
    assert abs(float(diff.std()) / want - 1) < 0.05


def _clients_of_instances(exp) -> np.ndarray:
    """How many clients each training instance sits on, counted from the clients' shards (an independent count)."""
    return np.bincount(np.concatenate([s.indices for s in exp.fed.shards]), minlength=exp.dataset.train.num_instances)


def test_instance_epsilon_composes_both_mechanisms_as_opacus_does(tmp_path):
    """The default config with DP on the server's W step and in client training: the reported ε is a fresh Opacus RDP
    accountant's over the history (σ_server, q_server, rounds) + (σ_local, q_local, rounds·k·E·round(1/q_local)), and
    no ε in metrics.jsonl exceeds the target."""
    rounds, target = 3, 6.0
    over = ["training.rounds=3", "evaluation.every=3", "output.progress=false", "device=cpu", "protocols=[dp]",
            "algorithm.normalize_gamma=false", f"privacy.instance={{clip_norm: 1.0, sample_rate: 0.1, target_epsilon: {target}}}",
            "privacy.local={clip_norm: 1.0, batch_sample_rate: 0.5, max_labels_per_instance: 3}"]  # fmt: skip
    exp = Experiment(load_plan(overrides=over), run_dir=tmp_path / "run")
    summary = exp.run(progress=False).summary
    unit = summary["privacy"]["units"]["instance"]
    mech = unit["mechanisms"]
    # the data has instances with up to 7 labels: the ledger counts the public bound 3, and no instance sits on more
    assert int(np.asarray(exp.dataset.train.labels.sum(axis=1)).max()) > 3
    assert _clients_of_instances(exp).max() == 3
    k = 3
    local_steps = rounds * k * exp.plan.training.local_epochs * 2  # round(1 / 0.5) = 2 steps an epoch
    assert mech["client_training"]["steps"] == local_steps and mech["server_w_step"]["steps"] == rounds
    acc = RDPAccountant()
    acc.history = [
        (mech["server_w_step"]["noise_multiplier"], 0.1, rounds),
        (mech["client_training"]["noise_multiplier"], 0.5, local_steps),
    ]
    # q < 1: the ledger's curve is Opacus's at its integer orders (protocols/dp/discrete_gaussian_accounting.py)
    assert unit["epsilon"] == pytest.approx(acc.get_epsilon(1e-5, alphas=[a for a in RDP_ORDERS if a.is_integer()]), rel=1e-9)
    prv = PRVAccountant()  # the calibration keeps PRV under the target too
    prv.history = list(acc.history)
    assert prv.get_epsilon(1e-5) <= target
    assert unit["epsilon"] <= target
    eps = [json.loads(line)["privacy"]["epsilon"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
           if "privacy" in json.loads(line)]  # fmt: skip
    assert len(eps) == rounds and all(float(e) <= target for e in eps) and eps == sorted(eps)
    assert not any("client training" in x for x in unit["not_covered"])


def test_budget_stops_client_training_before_the_target(tmp_path):
    """A fixed σ that cannot last the planned rounds: training stops before the round that would cross the target."""
    over = [*SMALL, "training.rounds=30", "protocols=[dp]", "algorithm.name=fedaws",
            "privacy.local={clip_norm: 1.0, noise_multiplier: 2.0, batch_sample_rate: 0.5, target_epsilon: 8, "
            "max_labels_per_instance: 8}"]  # fmt: skip
    exp = Experiment(load_plan(overrides=over), run_dir=tmp_path / "run")
    summary = exp.run(progress=False).summary
    unit = summary["privacy"]["units"]["instance"]
    assert summary["status"] == "budget_exhausted" and float(unit["epsilon"]) <= 8
    per_round = 8 * 1 * 2  # the bound's 8 copies × 1 epoch × round(1/0.5) steps
    assert unit["steps"] % per_round == 0
    acc = RDPAccountant()
    acc.history = [(2.0, 0.5, unit["steps"] + per_round)]
    assert acc.get_epsilon(1e-5) > 8  # the refused round would have crossed it


def test_noise_is_secret_from_the_public_seed(tmp_path):
    """Two runs with the same public seed and no privacy.noise_seed train different models (fresh client secrets);
    with the same noise_seed (debugging) they repeat exactly."""
    base = [*SMALL, "training.rounds=1", "protocols=[dp]", "algorithm.name=fedaws",
            "privacy.local={clip_norm: 1.0, noise_multiplier: 1.0, batch_sample_rate: 0.5, "
            "max_labels_per_instance: 8}"]  # fmt: skip
    thetas = []
    for i, extra in enumerate([[], [], ["privacy.noise_seed=5"], ["privacy.noise_seed=5"]]):
        exp = Experiment(load_plan(overrides=[*base, *extra]), run_dir=tmp_path / f"r{i}")
        exp.run(progress=False)
        thetas.append(torch.cat([t.flatten() for t in exp.theta.values()]))
    assert not torch.allclose(thetas[0], thetas[1])
    torch.testing.assert_close(thetas[2], thetas[3])
