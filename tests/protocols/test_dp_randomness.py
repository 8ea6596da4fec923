"""DP randomness is secret from the adversary: the noise cannot be regenerated from the public config,
two runs draw different noise, the draws are reproducible only from the drawing party's private key
(resume) or from an explicit ``privacy.noise_seed``, and client sampling is secret too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis
from scipy import stats

from protocols.config_sections import SecureAggregationConfig
from protocols.dp.accountant import RDP_ORDERS
from protocols.dp.layer import DifferentialPrivacy
from protocols.randomness import SecretStream
from secure_fed.engine import Experiment
from secure_fed.engine.aggregation import RoundSession
from tests.conftest import small_plan

# one round of plain FedAvg (server step x ← x + Δ̄), so the released θ¹ − θ⁰ is (Σ clipped updates + noise)/(qN)
ONE_ROUND = ["algorithm.name=fedavg", "training.rounds=1", "training.server_optimizer.name=fedavg",
             "training.server_optimizer.lr=1.0"]  # fmt: skip
SERVER_NOISE = ['protocols=["dp"]', 'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5}']
CLIENT_NOISE = ['protocols=["dp", "secure_aggregation"]',
                'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}']  # fmt: skip


def _dp(exp: Experiment) -> DifferentialPrivacy:
    return next(layer for layer in exp.stack.layers if isinstance(layer, DifferentialPrivacy))


def _flat(theta: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().double().flatten() for t in theta.values()])


def _released_update(tmp_path, name, *ov) -> torch.Tensor:
    e = Experiment(small_plan(*ONE_ROUND, *ov), run_dir=tmp_path / name)
    e.setup()
    theta0 = {n: t.clone() for n, t in e.theta.items()}
    e.train_round()
    return _flat(e.theta) - _flat(theta0)


def _regenerated_server_noise(tmp_path, *ov) -> torch.Tensor:
    """The attack: build the mechanism from the public config and draw round 0's noise on a zero sum."""
    att = Experiment(small_plan(*ONE_ROUND, *ov), run_dir=tmp_path / "attacker")
    base = RoundSession(cohort=list(range(len(att.fed.clients))), theta=att.theta, W=att.W, weighting="uniform")
    session = _dp(att).open_round(0, base)
    return _flat(session.post(base.finish()).theta_mean())


def _residual_ratio(released: torch.Tensor, truth: torch.Tensor, noise_hat: torch.Tensor) -> float:
    """‖(released − regenerated noise) − truth‖ / ‖regenerated noise‖: ≈ √2 if the noise is independent, ≈ 0 if regenerable."""
    return float((released - noise_hat - truth).norm() / noise_hat.norm())


@pytest.mark.parametrize("seeded", [False, True])
def test_server_noise_cannot_be_regenerated_from_the_public_config(tmp_path, seeded):
    ov = [*SERVER_NOISE, *(["privacy.noise_seed=1234"] if seeded else [])]
    released = _released_update(tmp_path, "target", *ov)
    # the un-noised update: the same clipped client updates (client training follows the public seed), σ ≈ 0
    truth = _released_update(tmp_path, "truth", *SERVER_NOISE[:1], 'privacy.client={"noise_multiplier": 1e-9, "clip_norm": 0.5}')
    noise_hat = _regenerated_server_noise(tmp_path, *ov)
    ratio = _residual_ratio(released, truth, noise_hat)
    if seeded:  # control: whoever knows privacy.noise_seed recovers the update, so the test has power
        assert ratio < 1e-4
    else:  # an independent draw: the residual is the difference of two noises, √2 times one noise's norm
        assert 1.2 < ratio < 1.65  # about 7σ either side of √2 (the draws vary between runs; 1.34-1.49 in 60)


def _client_share_sum(exp: Experiment, round_idx: int = 0) -> torch.Tensor:
    """What every client would add to a zero update in round ``round_idx`` (θ part), by the public code path."""
    base = RoundSession(cohort=list(range(len(exp.fed.clients))), theta=exp.theta, W=exp.W, weighting="uniform")
    session = _dp(exp).open_round(round_idx, base)
    session._set_min_summands(_secagg_t(exp))  # public: the secure sum's threshold t from the config
    zero = {"theta_delta": {n: torch.zeros_like(t) for n, t in exp.theta.items()}, "num_examples": 1, "loss": 0.0}
    fn = session.client_mod(lambda p, d: zero)
    return sum(_flat(fn({}, c)["theta_delta"]) for c in exp.fed.clients)


def _secagg_t(exp: Experiment) -> int:
    from protocols.secagg.protocol import threshold_for

    return threshold_for(len(exp.fed.clients), exp.plan.part(SecureAggregationConfig).threshold)


@pytest.mark.parametrize("seeded", [False, True])
def test_client_noise_shares_cannot_be_regenerated_by_the_server(tmp_path, seeded, monkeypatch):
    from protocols.dp import client_dp

    ov = [*CLIENT_NOISE, *(["privacy.noise_seed=99"] if seeded else [])]
    released = _released_update(tmp_path, "target", *ov)
    with monkeypatch.context() as mp:  # the noiseless reference (σ 1e-9): its shares are far below the refused 6 steps
        mp.setattr(client_dp, "MIN_SHARE_GRID_STEPS", 0.0)
        truth = _released_update(
            tmp_path, "truth", CLIENT_NOISE[0], 'privacy.client={"noise_multiplier": 1e-9, "clip_norm": 0.5, "noise": "clients"}'
        )
    att = Experiment(small_plan(*ONE_ROUND, *ov), run_dir=tmp_path / "attacker")
    n = len(att.fed.clients)
    noise_hat = _client_share_sum(att) / n  # fixed denominator q·N = N
    ratio = _residual_ratio(released, truth, noise_hat)
    if seeded:
        assert ratio < 1e-3  # fixed-point rounding of the secure sum only
    else:
        assert 1.2 < ratio < 1.65  # about 7σ either side of √2 (the draws vary between runs; 1.34-1.49 in 60)


def test_two_runs_of_one_dp_config_draw_different_noise_unless_seeded(tmp_path):
    a = _released_update(tmp_path, "a", *SERVER_NOISE)
    b = _released_update(tmp_path, "b", *SERVER_NOISE)
    assert not torch.equal(a, b)
    c = _released_update(tmp_path, "c", *SERVER_NOISE, "privacy.noise_seed=7")
    d = _released_update(tmp_path, "d", *SERVER_NOISE, "privacy.noise_seed=7")
    assert torch.equal(c, d)


def test_client_sampling_is_drawn_from_the_servers_secret(tmp_path):
    """Amplification by sampling needs a cohort the adversary cannot recompute from the seed."""
    ov = [*SERVER_NOISE, "training.client_fraction=0.5", "training.sampling=poisson", "training.rounds=3"]

    def cohorts(name, *extra):
        e = Experiment(small_plan(*ov, *extra, "output.log_messages=true"), run_dir=tmp_path / name)
        e.setup()
        out = []
        for _ in range(3):
            start = len(e.messages)
            e.train_round()
            out.append(sorted({m["client"] for m in e.messages[start:] if m["direction"] == "down"}))
        return out

    assert cohorts("a") != cohorts("b")  # 3 rounds of 8 coin flips: equal by chance with probability 2^-24
    assert cohorts("c", "privacy.noise_seed=5") == cohorts("d", "privacy.noise_seed=5")


def test_resume_without_noise_seed_continues_the_same_secret(tmp_path):
    """Two copies of one run checkpointed at round 2 and resumed separately end identical: the secret is
    restored from the private checkpoint; a fresh run with the same config ends elsewhere."""
    import shutil

    ov = [*SERVER_NOISE, "training.rounds=4", "output.checkpoint_every=1"]
    Experiment(small_plan(*ov, "training.rounds=2"), run_dir=tmp_path / "a").run(progress=False)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ends = []
    for name in ("a", "b"):
        e = Experiment(small_plan(*ov), run_dir=tmp_path / name)
        assert e.resume() and e.round == 2
        e.run(progress=False)
        ends.append(_flat(e.theta))
    fresh = Experiment(small_plan(*ov), run_dir=tmp_path / "fresh")
    fresh.run(progress=False)
    assert torch.equal(ends[0], ends[1])
    assert not torch.equal(ends[0], _flat(fresh.theta))


def test_secret_stream_draws_are_standard_normal_and_uniform():
    s = SecretStream.fresh()
    z = s.gaussian((200_000,), "z").numpy()
    # the draws are secret (fresh key), so the statistics vary between runs: p > 1e-7 and 6.7σ on the mean
    assert stats.kstest(z, "norm").pvalue > 1e-7
    assert abs(z.mean()) < 0.015 and abs(z.std() - 1.0) < 0.01
    u = s.uniform(100_000, "u")
    assert 0.0 < u.min() and u.max() < 1.0 and stats.kstest(u, "uniform").pvalue > 1e-7
    # the same label redraws the same values; another label, or another key, draws independent ones
    assert np.array_equal(s.uniform(1000, "u"), u[:1000])
    assert abs(np.corrcoef(s.uniform(10_000, "v"), u[:10_000])[0, 1]) < 0.05
    assert not np.array_equal(SecretStream.fresh().uniform(1000, "u"), u[:1000])
    assert "key" not in repr(s) and s.state_dict()["key"] not in repr(s).encode()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_secret_gaussian_pairs_have_exponential_radius_and_uniform_angle(dtype):
    """Box–Muller's two outputs of one pair: r²/2 ~ Exp(1) and the angle ~ U(0, 2π), independent of each other.
    Checked on both precisions (float32 computes the angle in float32 and the radius from a 53-bit uniform)."""
    s = SecretStream.fresh()
    n = 400_001
    z = s.gaussian((n,), "pairs", dtype=dtype).numpy()
    assert z.dtype == (np.float64 if dtype == torch.float64 else np.float32) and z.shape == (n,)
    pairs = (n + 1) // 2
    a, b = z[:pairs].astype(np.float64), np.append(z[pairs:], np.nan)[:pairs].astype(np.float64)
    a, b = a[:-1], b[:-1]  # the last pair lost its sine to the odd length
    assert stats.kstest(z, "norm").pvalue > 1e-7  # fresh key: p-values vary between runs
    assert stats.kstest((a**2 + b**2) / 2, "expon").pvalue > 1e-7
    angle = np.mod(np.arctan2(b, a), 2 * np.pi)
    assert stats.kstest(angle / (2 * np.pi), "uniform").pvalue > 1e-7
    assert abs(stats.spearmanr(angle, a**2 + b**2).statistic) < 0.01
    # the same label redraws the same values, in either precision
    assert np.array_equal(s.gaussian((n,), "pairs", dtype=dtype).numpy(), z)


def test_noise_seed_run_says_its_epsilon_does_not_hold_against_who_knows_it(tmp_path):
    s = Experiment(small_plan(*SERVER_NOISE, "training.rounds=1", "privacy.noise_seed=3"), run_dir=tmp_path).run(progress=False)
    assert "noise_seed" in s.summary["privacy"]["warning"]
    s2 = Experiment(small_plan(*SERVER_NOISE, "training.rounds=1"), run_dir=tmp_path / "b").run(progress=False)
    assert "warning" not in s2.summary["privacy"]


def test_epsilon_is_reported_per_adversary(tmp_path):
    rounds = 3
    server = Experiment(small_plan(*SERVER_NOISE, f"training.rounds={rounds}"), run_dir=tmp_path / "s").run(progress=False)
    adv = server.summary["privacy"]["units"]["client"]["adversaries"]
    assert adv["server"]["epsilon"] == "inf" and adv["observer"]["epsilon"] == server.summary["privacy"]["epsilon"]

    # fedavg: every released tensor is a noised client sum (fedalc's W would also take an un-noised label-set step,
    # which makes the observer's ε ∞)
    clients = Experiment(small_plan(*CLIENT_NOISE, f"training.rounds={rounds}", "training.client_fraction=0.5",
                                      "training.sampling=poisson", "algorithm.name=fedavg"),
                         run_dir=tmp_path / "c").run(progress=False)  # fmt: skip
    unit = clients.summary["privacy"]["units"]["client"]
    ref_server, ref_observer = RDPAccountant(), RDPAccountant()  # independent: Opacus directly
    for _ in range(rounds):
        ref_server.step(noise_multiplier=2.0, sample_rate=1.0)  # the server knows the cohort: no amplification
        ref_observer.step(noise_multiplier=2.0, sample_rate=0.5)
    assert unit["adversaries"]["server"]["epsilon"] == pytest.approx(ref_server.get_epsilon(1e-5), rel=1e-9)
    # at q < 1 the ledger's curve is Opacus's at its integer orders (protocols/dp/discrete_gaussian_accounting.py)
    ints = [a for a in RDP_ORDERS if float(a).is_integer()]
    assert unit["adversaries"]["observer"]["epsilon"] == pytest.approx(ref_observer.get_epsilon(1e-5, alphas=ints), rel=1e-9)
    assert unit["adversaries"]["server"]["epsilon"] > unit["adversaries"]["observer"]["epsilon"]

    inst = Experiment(small_plan('protocols=["dp"]', "algorithm.normalize_gamma=false", "training.rounds=2",
                                   'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}'),
                      run_dir=tmp_path / "i").run(progress=False)  # fmt: skip
    assert inst.summary["privacy"]["units"]["instance"]["adversaries"]["server"]["epsilon"] == "inf"


@pytest.mark.parametrize("bound", [None, 2])
def test_client_level_dp_reports_instance_level_group_privacy(tmp_path, bound):
    """The group is the public bound on the clients an instance sits on: privacy.client.max_labels_per_instance,
    or without one the number of labels (every instance could have them all); never the data's largest label count."""
    ov = [] if bound is None else [f"privacy.client.max_labels_per_instance={bound}"]
    e = Experiment(small_plan(*SERVER_NOISE, "training.rounds=2", *ov), run_dir=tmp_path)
    s = e.run(progress=False).summary
    unit = s["privacy"]["units"]["client"]
    data_k = int(np.asarray(e.dataset.train.labels.sum(axis=1)).max())  # positive-only: one client per label
    k = e.dataset.num_labels if bound is None else bound
    assert k != data_k  # the data's count would give another group
    # each client an instance sits on, counted from the shards: never more than k
    assert np.bincount(np.concatenate([sh.indices for sh in e.fed.shards])).max() <= k
    # removing the instance substitutes each of its k clients' updates: the group bound over k clients, at q = 1
    # (every client every round): the Gaussian at sensitivity 2kC, α(2k)²/(2σ²) per round, Opacus's conversion
    assert unit["instance_level"]["group_size"] == k
    rdp = [2 * a * (2 * k) ** 2 / (2 * 2.0**2) for a in RDPAccountant.DEFAULT_ALPHAS]  # 2 rounds, σ = 2
    eps, _ = privacy_analysis.get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=unit["delta"])
    assert unit["instance_level"]["epsilon"] == pytest.approx(eps, rel=1e-9)
    assert unit["instance_level"]["delta"] == unit["delta"]


def _empty_cohort_round(tmp_path, *ov) -> tuple[Experiment, torch.Tensor]:
    """One round of plain FedAvg (server lr 1) whose secret Poisson cohort comes out empty."""
    e = Experiment(small_plan(*ONE_ROUND, *ov, "training.client_fraction=0.5", "training.sampling=poisson"),
                   run_dir=tmp_path)  # fmt: skip
    e.setup()
    e.stack.cohort_uniforms = lambda r, n: np.ones(n)  # every client's draw above q: nobody is sampled
    theta0 = _flat(e.theta)
    out = e.train_round()
    assert "aborted" not in out and e.rounds_aborted == 0
    return e, _flat(e.theta) - theta0


@pytest.mark.parametrize("ov", [SERVER_NOISE, CLIENT_NOISE], ids=["server_noise", "client_noise_shares"])
def test_an_empty_poisson_cohort_releases_the_full_noise_and_is_charged(tmp_path, ov):
    """An empty sample is one outcome of the sampled Gaussian mechanism: the release is N(0, σ²S²)/(qN) on every
    coordinate, and the round costs one step. With noise shares nobody is there to add them: the server draws it."""
    e, released = _empty_cohort_round(tmp_path, *ov)
    sigma, clip, q, n = 2.0, 0.5, 0.5, len(e.fed.clients)
    expected_std = sigma * clip / (q * n)
    assert released.numel() > 1000
    # a chi-square test on the released coordinates' spread (independent of the layer's code: σ, S, q, N from the config)
    z = float((released / expected_std).pow(2).sum())
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], released.numel())
    assert lo < z < hi, (z, lo, hi)
    ref = RDPAccountant()
    ref.step(noise_multiplier=sigma, sample_rate=q)
    assert _dp(e).units["client"].steps == 1
    ints = [a for a in RDP_ORDERS if float(a).is_integer()]  # q < 1: the ledger's curve is Opacus's at these orders
    assert _dp(e).units["client"].epsilon() == pytest.approx(ref.get_epsilon(1e-5, alphas=ints), rel=1e-9)


def test_a_round_the_secure_sum_aborts_is_still_charged(tmp_path):
    """Dropouts below the secure sum's threshold abort the round after its secret cohort trained: the abort is
    observable, so the round costs a step like any other."""
    e = Experiment(small_plan(*CLIENT_NOISE, "training.rounds=3", "secure_aggregation.dropout=0.95"), run_dir=tmp_path)
    e.setup()
    for _ in range(3):
        e.train_round()
    assert e.rounds_aborted == 3
    ref = RDPAccountant()
    for _ in range(3):
        ref.step(noise_multiplier=2.0, sample_rate=1.0)
    assert _dp(e).units["client"].steps == 3
    assert _dp(e).units["client"].epsilon() == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)


def test_a_round_re_run_after_an_interrupt_is_charged_once(tmp_path):
    """Interrupted inside round 0 (its steps charged, checkpointed), resumed: round 0 runs again with the same secret
    draws, so the ledger does not charge it twice; round 1 is charged as usual. Each unit independently (Opacus)."""
    ov = ['protocols=["dp"]', 'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5}', "algorithm.name=fedavg",
          'privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "max_labels_per_instance": 8}']  # fmt: skip
    e = Experiment(small_plan(*ov), run_dir=tmp_path / "a")
    dp = _dp(e)
    base = lambda: RoundSession(cohort=[0], theta=e.theta, W=e.W, weighting="uniform")  # noqa: E731
    dp.open_round(0, base())
    dpsgd_steps, client_unit_steps = dp.units["instance"].mechanism("client_training").steps, dp.units["client"].steps
    assert dpsgd_steps > 0 and client_unit_steps == 1
    resumed = _dp(Experiment(small_plan(*ov), run_dir=tmp_path / "b"))
    resumed.load_state_dict(dp.state_dict())
    resumed.open_round(0, base())  # the interrupted round again
    assert resumed.units["client"].steps == 1
    assert resumed.units["instance"].mechanism("client_training").steps == dpsgd_steps
    resumed.open_round(1, base())
    assert resumed.units["client"].steps == 2
    assert resumed.units["instance"].mechanism("client_training").steps == 2 * dpsgd_steps
    ref = RDPAccountant()
    for _ in range(2):
        ref.step(noise_multiplier=2.0, sample_rate=1.0)
    assert resumed.units["client"].epsilon() == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)


def test_a_client_trains_a_round_again_only_on_the_same_payload(tmp_path):
    """The DP layer's client side remembers, per client, a digest of the payload and plan it trained each round on
    (in its client state, so a node keeps it across messages and a resumed run); another payload or plan for a
    trained round is refused, the same ones are not; without round-addressed client randomness nothing is checked."""
    exp = Experiment(small_plan("protocols=[dp]", "privacy.local={noise_multiplier: 1.0, clip_norm: 1.0, "
                                  "batch_sample_rate: 0.5, max_labels_per_instance: 8}", "algorithm.name=fedaws"),
                     run_dir=tmp_path / "a")  # fmt: skip
    dp = exp.stack.by_name()["dp"]
    a, b = {"theta": {"w": torch.zeros(3)}}, {"theta": {"w": torch.tensor([0.0, 0.0, 1e-7])}}
    plan, other_plan = [{"op": "x", "std": 1.0}], [{"op": "x", "std": 1.5}]
    dp.check_round_payload(3, 0, a, plan)
    dp.check_round_payload(3, 0, {"theta": {"w": torch.zeros(3)}}, [{"op": "x", "std": 1.0}])  # the same again
    dp.check_round_payload(3, 1, b, plan)  # another round
    dp.check_round_payload(4, 0, b, plan)  # another client
    with pytest.raises(PermissionError, match="client 3: round 0 arrived again with another payload or plan"):
        dp.check_round_payload(3, 0, b, plan)
    with pytest.raises(PermissionError, match="client 3: round 0 arrived again"):
        dp.check_round_payload(3, 0, a, other_plan)
    state = dp.client_state_dict()
    fresh = Experiment(exp.plan, run_dir=tmp_path / "b").stack.by_name()["dp"]
    fresh.load_client_state_dict(state)  # a node's next message (or a resumed run) takes the record up
    with pytest.raises(PermissionError, match="round 1 arrived again"):
        fresh.check_round_payload(3, 1, a, plan)
    fresh.load_client_state_dict({cid: {k: v for k, v in st.items() if k != "trained"} for cid, st in state.items()})
    fresh.check_round_payload(3, 1, a, plan)  # state from before the record existed: nothing remembered

    server_noise = Experiment(small_plan("protocols=[dp]", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5}"),
                              run_dir=tmp_path / "c").stack.by_name()["dp"]  # fmt: skip
    server_noise.check_round_payload(3, 0, a, plan)
    server_noise.check_round_payload(3, 0, b, plan)  # no client randomness: nothing to protect
