"""MOON (``examples/plugins/moon``), registered by entry point alone: its term is zero (value and gradient) when the
previous and the global model coincide; it equals the paper's ℓ_con written out independently; a client's update is
gradient descent on loss + μ·ℓ_con with its own previous model (kept in its state); it runs under ``dp`` (local and
client level), ``dp`` with secure aggregation and on Flower; and the vectorised executor runs its clients one at a
time, saying so in the run's private summary."""

from __future__ import annotations

import json
import math

import torch
from torch import nn

from secure_fed.algorithms.base import ClientData
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.algorithms.losses import bce_loss
from secure_fed.algorithms.objective import ObjectiveContext
from secure_fed.models.families import LinearHead, LinearHeadModel
from tests.conftest import small_plan
from tests.examples.helpers import CLIENT_DP, run_fresh
from tests.examples.test_fedprox import LOCAL_DP

MU, TAU, LR = 2.0, 0.5, 0.1


def _model(seed: int) -> LinearHeadModel:
    torch.manual_seed(seed)
    return LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)


def _theta(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _l_con(z, z_glob, z_prev) -> torch.Tensor:
    """The paper's eq. 3 as written: −log(e^{sim(z,z_glob)/τ} / (e^{sim(z,z_glob)/τ} + e^{sim(z,z_prev)/τ}))."""
    cos = nn.functional.cosine_similarity
    e_glob, e_prev = torch.exp(cos(z, z_glob, dim=-1) / TAU), torch.exp(cos(z, z_prev, dim=-1) / TAU)
    return -torch.log(e_glob / (e_glob + e_prev))


def test_the_term_is_zero_when_the_previous_and_the_global_model_coincide(plugin_path):
    from moon.algorithm import ModelContrast

    model, x = _model(0), torch.randn(10, 6)
    glob = _theta(_model(1))  # the weights being trained differ from the global model's
    ctx = ObjectiveContext(glob, {}, LR, 10)  # no previous model in the state: the global model's (first round)
    term = ModelContrast(MU, TAU)
    term.begin(ctx)
    trainer = LocalTrainer(model, LinearHead())
    value = term.per_example_term(trainer._represent, x, None, ctx)
    assert float(value.detach().abs().max()) < 1e-6
    grads = torch.autograd.grad(value.sum(), list(model.parameters()), allow_unused=True)
    assert all(g is None or float(g.abs().max()) < 1e-6 for g in grads)


def test_the_term_is_the_papers_and_the_update_descends_loss_plus_term(plugin_path):
    """A client whose previous model (its state) differs from the global one: the term equals eq. 3 − log 2, and
    the trainer's full-batch update equals autograd's on bce + μ·ℓ_con; the state then holds the client's new model."""
    from moon.algorithm import STATE_KEY, ModelContrast

    glob, prev = _theta(_model(0)), _theta(_model(1))
    x, y = torch.randn(12, 6), torch.rand(12, 4) < 0.3
    data = ClientData(0, x, y, torch.arange(4), None, num_labels=4, state={STATE_KEY: prev})
    trainer = LocalTrainer(_model(2), LinearHead())
    ctx = ObjectiveContext(glob, {STATE_KEY: prev}, LR, 12)
    term = ModelContrast(MU, TAU)
    term.begin(ctx)
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            p.copy_(glob[n] + 0.1 * torch.randn_like(p))
        got = term.per_example_term(trainer._represent, x, y, ctx)
        z, z_glob, z_prev = trainer.model(x), trainer._represent(x, glob), trainer._represent(x, prev)
    torch.testing.assert_close(got, MU * (_l_con(z, z_glob, z_prev) - math.log(2.0)), atol=1e-5, rtol=1e-5)

    hp = LocalTraining(epochs=3, batch_size=12, lr=LR)
    payload = {"theta": glob, "train_rows": False, "loss": "bce"}
    delta = trainer.update_one(payload, data, hp, torch.Generator().manual_seed(0), None, term)["theta_delta"]
    ref, ref_glob, ref_prev = _model(0), _model(0), _model(0)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(glob[n])
            dict(ref_glob.named_parameters())[n].copy_(glob[n])
            dict(ref_prev.named_parameters())[n].copy_(prev[n])
        z_glob, z_prev = ref_glob(x), ref_prev(x)
    for _ in range(3):
        z = ref(x)
        loss = bce_loss(z, y) + MU * _l_con(z, z_glob, z_prev).mean()
        grads = torch.autograd.grad(loss, list(ref.parameters()))
        with torch.no_grad():
            for p, g in zip(ref.parameters(), grads, strict=True):
                p -= LR * g
    for n, p in ref.named_parameters():
        torch.testing.assert_close(delta[n], p.detach() - glob[n], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(data.state[STATE_KEY][n], p.detach(), atol=1e-6, rtol=1e-5)


def test_it_runs_under_dp_secure_aggregation_and_on_flower(tmp_path, plugin_path):
    common = ["algorithm.name=moon", "algorithm.mu=1", "training.rounds=2"]
    client_dp = [CLIENT_DP, "privacy.noise_seed=7"]
    runs = run_fresh(
        plugin_path, tmp_path,
        [*common, 'protocols=["dp"]', *client_dp], [*common, 'protocols=["dp", "secure_aggregation"]', *client_dp],
        [*common, *LOCAL_DP, "backend=flower"], [*common, *LOCAL_DP], ["algorithm.name=fedavg", *LOCAL_DP],
    )  # fmt: skip
    for r in runs[:4]:
        assert r["summary"]["rounds_completed"] == 2 and r["summary"]["algorithm"] == "moon"
        assert math.isfinite(r["summary"]["privacy"]["epsilon"])
    assert runs[1]["sent"] == []  # the server saw masked updates only
    assert all(n <= 1.0 * (1 + 1e-6) for _, _, n in runs[0]["sent"])  # dp's clip_norm
    assert runs[2]["summary"]["final"] == runs[3]["summary"]["final"]  # on Flower (state on the nodes) as in process
    assert runs[3]["summary"]["final"] != runs[4]["summary"]["final"]  # the term changes training (round 2)


def test_the_vectorised_executor_trains_moon_one_client_at_a_time_and_says_so(tmp_path, plugin_path):
    from secure_fed.engine import Experiment

    overrides = ["algorithm.name=moon", "training.rounds=2", "evaluation.every=2", "model.family=linear_head",
                 "partition.name=cmda", "partition.num_clients=4", "partition.kmodes_inits=2"]  # fmt: skip
    seq = Experiment(small_plan(*overrides), run_dir=tmp_path / "seq").run(progress=False)
    Experiment(small_plan(*overrides, "training.executor=vectorized"), run_dir=tmp_path / "vec").run(progress=False)
    report = json.loads((tmp_path / "vec" / "private" / "summary.json").read_text())["executor"]
    assert report["updates_batched"] == 0
    assert report["updates_one_at_a_time"] == {"client objective 'moon' (per-example term)": 2 * 4}
    vec = json.loads((tmp_path / "vec" / "summary.json").read_text())
    assert vec["final"] == seq.summary["final"]  # one at a time: the reference trainer's result
