"""SCAFFOLD (``examples/plugins/scaffold``), registered by entry point alone: it beats FedAvg on a heterogeneous
problem of the paper's kind (each algorithm's learning rate tuned on validation data; a positive paired difference
in each of 3 seeds); the server's control variate is derived from the released mean update alone, and equals the
mean of the clients' own c_i (which never leave them); and it runs under ``dp`` (local and client level), ``dp``
with secure aggregation, and on Flower."""

from __future__ import annotations

import json
import math
import types

import torch
from torch import nn

from secure_fed.algorithms.base import Algorithm, ClientData
from secure_fed.algorithms.client import LocalTrainer, LocalTraining
from secure_fed.algorithms.losses import bce_loss
from secure_fed.models.families import LinearHead, LinearHeadModel
from tests.conftest import small_plan
from tests.examples.helpers import CLIENT_DP, run_fresh
from tests.examples.test_fedprox import LOCAL_DP

D, C, N, H = 10, 4, 8, 16  # features, labels, clients, hidden width
GRID = (0.03, 0.1, 0.3)  # the local learning rates tried, for each algorithm
ROUNDS = 15


def heterogeneous_problem(seed: int) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """N clients of multi-label logistic regression, each with its own feature mean (covariate shift) and its own
    labelling weights W + U_i (concept shift, ‖U_i‖ ~ ‖W‖): the client drift SCAFFOLD corrects. Per client 40
    training, 40 validation and 40 test examples."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(D, C, generator=g)
    out = []
    for _ in range(N):
        mu, Wi = 1.5 * torch.randn(D, generator=g), W + torch.randn(D, C, generator=g)

        def draw(m: int, mu=mu, Wi=Wi):
            x = mu + torch.randn(m, D, generator=g)
            return x, (x @ Wi + 0.3 * torch.randn(m, C, generator=g)) > 0

        out.append({split: draw(40) for split in ("train", "val", "test")})
    return out


def federate(parts, algo: Algorithm, scaffold: bool, lr: float, seed: int) -> tuple[float, float]:
    """ROUNDS rounds of full participation, 5 local epochs of batches of 10 (K = 20 steps), uniform averaging; the
    same model initialisation and client generators for both algorithms (paired). Returns the global objective (the
    clients' mean BCE) on their validation and test data."""
    torch.manual_seed(seed)
    model = LinearHeadModel(nn.Linear(D, H), H, C)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = LocalTrainer(model, LinearHead())
    hp = LocalTraining(epochs=5, batch_size=10, lr=lr)
    algo.setup(types.SimpleNamespace(num_clients=N))
    clients = [ClientData(i, p["train"][0], p["train"][1], torch.arange(C), None, num_labels=C) for i, p in enumerate(parts)]
    for r in range(ROUNDS):
        deltas = []
        for i, data in enumerate(clients):
            payload = algo.downlink(theta, None, data.known_labels)
            objective = algo.client_objective(payload, data) if scaffold else None
            gen = torch.Generator().manual_seed(seed * 100_000 + r * 100 + i)
            deltas.append(trainer.update_one(payload, data, hp, gen, None, objective)["theta_delta"])
        mean = {n: torch.stack([d[n] for d in deltas]).mean(0) for n in theta}
        if scaffold:
            algo.server_aggregate(mean, N)
        theta = {n: theta[n] + mean[n] for n in theta}

    def objective_on(split: str) -> float:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(theta[n])
            v = sum(float(bce_loss(model(p[split][0]), p[split][1])) for p in parts) / N
        return v if math.isfinite(v) else math.inf

    return objective_on("val"), objective_on("test")


def test_scaffold_beats_fedavg_on_a_heterogeneous_problem_in_each_of_3_seeds(plugin_path):
    from scaffold.algorithm import Scaffold
    from scaffold.params import ScaffoldParams

    diffs = []
    for seed in range(3):
        parts = heterogeneous_problem(seed)
        test_at_best = []
        for scaffold in (False, True):  # FedAvg: the same loop without the objective and the server's control variate
            runs = {lr: federate(parts, Scaffold(ScaffoldParams(), loss="bce"), scaffold, lr, seed) for lr in GRID}
            best = min(GRID, key=lambda lr: runs[lr][0])  # tuned on validation data
            test_at_best.append(runs[best][1])
        diffs.append(test_at_best[0] - test_at_best[1])  # FedAvg's test objective − SCAFFOLD's
    print("FedAvg − SCAFFOLD, test BCE, per seed:", diffs)
    assert all(d > 0 for d in diffs), diffs


def test_the_server_control_variate_is_the_mean_of_the_clients_own_and_nothing_else_is_sent(tmp_path, plugin_path):
    """Under DP-SGD in client training every client takes the same K steps (DP-SGD's fixed steps per epoch): the
    server's ĉ, derived from the mean update alone, equals Kη·mean_i c_i, computed from the clients' own states. The
    clients' uplinks carry FedAvg's keys only (c_i is never sent; the guard refuses an undeclared key)."""
    from scaffold.algorithm import STATE_KEY, Scaffold

    from secure_fed.engine import Experiment
    from tests.conftest import small_plan

    assert Scaffold.uplink_rules == Algorithm.uplink_rules
    plan = small_plan("algorithm.name=scaffold", "training.rounds=3", "evaluation.every=3", "output.log_messages=true",
                      "training.server_optimizer.name=fedavg", "training.server_optimizer.lr=1.0", *LOCAL_DP)  # fmt: skip
    exp = Experiment(plan, run_dir=tmp_path)
    exp.run(progress=False)
    ups = [m["message"] for m in exp.messages if m["direction"] == "up" and "theta_delta" in m["message"]]
    assert ups and all(set(m) <= set(Algorithm.uplink_rules) for m in ups)
    k_eta = exp.stack.local_privatizer(0, 0).steps_per_epoch() * plan.training.local_epochs * plan.training.client_lr
    states = [c.state[STATE_KEY] for c in exp.fed.clients]
    assert len(states) == len(exp.fed.clients) > 1
    for n, c_hat in exp.algorithm.control.items():
        mean_c_i = torch.stack([s[n] for s in states]).mean(0)
        assert float(c_hat.abs().max()) > 0
        torch.testing.assert_close(c_hat, k_eta * mean_c_i, atol=1e-6, rtol=1e-4)


def test_it_runs_under_client_dp_secure_aggregation_and_on_flower(tmp_path, plugin_path):
    common = ["algorithm.name=scaffold"]
    client_dp = [CLIENT_DP, "privacy.noise_seed=7"]
    runs = run_fresh(
        plugin_path, tmp_path,
        [*common, 'protocols=["dp"]', *client_dp], [*common, 'protocols=["dp", "secure_aggregation"]', *client_dp],
        [*common, *LOCAL_DP, "backend=flower"], [*common, *LOCAL_DP], ["algorithm.name=fedavg", *LOCAL_DP],
    )  # fmt: skip
    for r in runs[:4]:
        assert r["summary"]["rounds_completed"] == 2 and r["summary"]["algorithm"] == "scaffold"
        assert math.isfinite(r["summary"]["privacy"]["epsilon"])
    assert runs[1]["sent"] == []  # the server saw masked updates only
    assert all(n <= 1.0 * (1 + 1e-6) for _, _, n in runs[0]["sent"])  # dp's clip_norm
    assert runs[2]["summary"]["final"] == runs[3]["summary"]["final"]  # on Flower (state on the nodes) as in process
    assert runs[3]["summary"]["final"] != runs[4]["summary"]["final"]  # the correction changes training (round 2)


def test_a_resumed_run_takes_up_the_control_variates_exactly(tmp_path, plugin_path):
    """The clients' c_i (their state, in the clients' checkpoint) and the server's ĉ (the algorithm's state) survive a
    checkpoint: 2 rounds, resume, 2 more equal 4 rounds at once."""
    from scaffold.algorithm import STATE_KEY

    from secure_fed.engine import Experiment

    ov = ["algorithm.name=scaffold", "training.rounds=4", "evaluation.every=1", "output.checkpoint_every=2"]
    a = Experiment(small_plan(*ov), run_dir=tmp_path / "a")
    a.run(progress=False)
    Experiment(small_plan(*ov, "training.rounds=2"), run_dir=tmp_path / "b").run(progress=False)
    b = Experiment(small_plan(*ov), run_dir=tmp_path / "b")
    assert b.resume() and b.round == 2
    b.run(progress=False)
    for ca, cb in zip(a.fed.clients, b.fed.clients, strict=True):
        assert all(torch.equal(ca.state[STATE_KEY][n], cb.state[STATE_KEY][n]) for n in ca.state[STATE_KEY])
    assert all(torch.equal(a.algorithm.control[n], b.algorithm.control[n]) for n in a.algorithm.control)
    read = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in "ab"]
    assert [r["round"] for r in read[1]] == [1, 2, 3, 4]
    assert [r["mAP"] for r in read[0]] == [r["mAP"] for r in read[1]]


def test_the_vectorised_executor_trains_scaffold_clients_together_as_the_sequential_does(tmp_path, plugin_path):
    """SCAFFOLD's correction is an affine term (rate 0, offset c − c_i): the vectorised executor trains its clients in
    groups (none one at a time; deferred updates, the engine's default there, and ``end`` reads each client's dense
    update for its c_i) and after 3 rounds (the correction is 0 in round 1) θ's move, the server's ĉ and every
    client's c_i equal the sequential executor's within 1e-4 (relative, fp32), where FedAvg's move differs by more
    than 3e-2."""
    from scaffold.algorithm import STATE_KEY

    from secure_fed.algorithms.batched_sgd import relative_error
    from secure_fed.engine import Experiment
    from tests.conftest import small_plan
    from tests.engine.test_vectorized import PLAIN

    ov = ["algorithm.name=scaffold"]
    start = Experiment(small_plan(*PLAIN, *ov), run_dir=tmp_path / "start")
    start.setup()
    runs = {}
    for name, extra in {"seq": [], "vec": ["training.executor=vectorized"], "avg": ["algorithm.name=fedavg"]}.items():
        exp = Experiment(small_plan(*PLAIN, *ov, *extra), run_dir=tmp_path / name)
        exp.setup()
        for _ in range(3):
            exp.train_round()
        runs[name] = exp
    seq, vec, avg = runs["seq"], runs["vec"], runs["avg"]
    report = vec.executor.report()  # the summary's ``executor`` record
    assert report["updates_batched"] > 0 and report["updates_one_at_a_time"] == {}
    assert vec.trainer.deferred_updates  # the deferred path: ``end`` formed the dense updates it reads

    def moved(exp):
        return {n: exp.theta[n] - start.theta[n] for n in start.theta}

    err, term = relative_error(moved(vec), moved(seq)), relative_error(moved(avg), moved(seq))
    print(f"θ's move: vectorised vs sequential {err:.2e}; FedAvg vs SCAFFOLD {term:.2e}")
    assert err < 1e-4 and term > 3e-2
    assert relative_error(vec.algorithm.control, seq.algorithm.control) < 1e-4
    for cv, cs in zip(vec.fed.clients, seq.fed.clients, strict=True):
        assert (STATE_KEY in cv.state) == (STATE_KEY in cs.state)
        if STATE_KEY in cs.state:
            assert relative_error(cv.state[STATE_KEY], cs.state[STATE_KEY]) < 1e-4


def test_the_client_update_and_its_new_control_variate_are_the_papers(plugin_path):
    """Independent computation (Algorithm 1, option II) for one client with a server ĉ and its own c_i: K full-batch
    steps y ← y − η(∇F(y) − c_i + c), c = ĉ/(Kη), written out with autograd, and c_i⁺ = c_i − c + (x − y)/(Kη)."""
    from scaffold.algorithm import STATE_KEY, ControlVariates

    torch.manual_seed(0)
    lr, steps = 0.1, 4
    model = LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}
    control = {n: 0.2 * torch.randn_like(t) for n, t in theta.items()}
    c_i = {n: 0.5 * torch.randn_like(t) for n, t in theta.items()}
    x, y = torch.randn(12, 6), torch.rand(12, 4) < 0.3
    data = ClientData(0, x, y, torch.arange(4), None, num_labels=4, state={STATE_KEY: c_i})
    hp = LocalTraining(epochs=steps, batch_size=12, lr=lr)
    payload = {"theta": theta, "train_rows": False, "loss": "bce"}
    trainer = LocalTrainer(model, LinearHead())
    got = trainer.update_one(payload, data, hp, torch.Generator().manual_seed(0), None, ControlVariates(control))

    k_eta = steps * lr
    c = {n: t / k_eta for n, t in control.items()}
    ref = LinearHeadModel(nn.Sequential(nn.Linear(6, 8), nn.ReLU()), 8, 4)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(theta[n])
    names = [n for n, _ in ref.named_parameters()]
    for _ in range(steps):
        grads = torch.autograd.grad(bce_loss(ref(x), y), list(ref.parameters()))
        with torch.no_grad():
            for n, p, g in zip(names, ref.parameters(), grads, strict=True):
                p -= lr * (g - c_i[n] + c[n])
    plain = LocalTrainer(model, LinearHead()).update_one(payload, data, hp, torch.Generator().manual_seed(0))["theta_delta"]
    for n, p in ref.named_parameters():
        want = p.detach() - theta[n]
        torch.testing.assert_close(got["theta_delta"][n], want, atol=1e-6, rtol=1e-5)
        assert float((want - plain[n]).abs().max()) > 1e-2  # the correction's share ≫ the tolerance
        torch.testing.assert_close(data.state[STATE_KEY][n], c_i[n] - c[n] - want / k_eta, atol=1e-5, rtol=1e-5)
