"""``privacy.local.noise: shares`` (distributed DP-FedSGD for the instance unit): each client's one DP-SGD step a round
sends its clipped gradient sum with a discrete Gaussian noise share σ(C + γ√d)/√t through secure aggregation, so the
server's sum carries the calibrated central noise once; the instance unit accounts one subsampled Gaussian step at
(σ, q) a round; bad combinations are one ``error:`` line."""

from __future__ import annotations

import math

import pytest
import torch
from opacus.accountants import RDPAccountant

from protocols.dp.accountant import RDP_ORDERS
from protocols.dp.client_dp import update_dim
from protocols.dp.discrete_gaussian import release_grid
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.randomness import SecretStream
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from secure_fed.engine.aggregation import RoundSession
from secure_fed.errors import ConfigError
from tests.config.test_bad_input import _default, assert_one_error_line, cli
from tests.conftest import small_config, small_plan

SIGMA, CLIP, Q = 1.5, 1.0, 0.8
SHARES = f"privacy.local={{clip_norm: {CLIP}, noise_multiplier: {SIGMA}, batch_sample_rate: {Q}, max_labels_per_instance: 1, noise: shares}}"  # noqa: E501
BASE = ["algorithm.name=fedaws", 'protocols=["dp", "secure_aggregation"]', "privacy.noise_seed=3"]


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.double().flatten() for t in tensors])


def test_the_server_sum_carries_the_central_noise_once_not_once_per_client(tmp_path):
    """10 clients, t = 6: each adds a share of std σ(C + γ√d)/√6; the 6 survivors' secure sum minus their true clipped
    sums has variance σ²(C + γ√d)² (the accounted noise), all 10 have 10/6 of it, and 6 clients each adding the full
    noise (noise: local) have 6× (the cohort's). Measured over every θ coordinate (≈1,000 independent draws) and the
    row shares, to 6 standard errors of a sample variance; the server divides by public constants only."""
    e = Experiment(small_plan(*BASE, SHARES, "training.rounds=1", "dataset.synthetic.num_labels=10"), run_dir=tmp_path)
    dp = e.stack.by_name()["dp"]
    n, t = 10, 6
    assert len(e.fed.clients) >= n
    gen = torch.Generator().manual_seed(0)
    sums = {c: {k: torch.randn(v.shape, generator=gen, dtype=torch.float64) * 0.01 for k, v in e.theta.items()}
            for c in range(n)}  # fmt: skip
    template = {"theta_delta": {k: torch.zeros_like(v) for k, v in e.theta.items()}, "num_examples": 7, "loss": 1.5}
    rows_shape = (dp.env.num_labels, dp.env.embedding_dim)
    _, corrected = release_grid(CLIP, update_dim(template, rows_shape), dp.settings.encoding_grid)
    central = (SIGMA * corrected) ** 2

    def summed(survivors: int):
        session = dp.open_round(0, RoundSession(cohort=list(range(n)), theta=e.theta, W=e.W, weighting="uniform"))
        session._set_min_summands(t)
        fn = session.client_mod(lambda p, d: template)
        row_noise = torch.zeros(rows_shape, dtype=torch.float64)
        for c in range(survivors):
            dp._local_sums[c] = sums[c]  # what the client's LocalShareSums handed over after its step
            reply = fn({}, e.fed.clients[c])
            assert reply["loss"] == 0.0 and "row_noise" in reply
            row_noise += reply["row_noise"].double()
            session.submit(c, reply)
        agg = session.finish()
        truth = _flat(sum(sums[c][k] for c in range(survivors)) for k in e.theta)
        noise = -_flat(agg.theta_sum.values()) - truth  # the replies carry −(clipped sum + share)
        return agg, torch.cat([noise, row_noise.flatten()])

    agg, noise = summed(t)
    band = 6 * math.sqrt(2 / noise.numel())
    assert noise.var().item() / central == pytest.approx(1.0, abs=band)
    _, all_ten = summed(n)
    assert all_ten.var().item() / central == pytest.approx(n / t, rel=band)
    # public divisors: θ's mean is −η·Σ(s + Z)/(B·n̄), n̄ the expected cohort (here every client of the federation)
    tr = e.plan.training
    assert agg.theta_denominator == pytest.approx(len(e.fed.clients) * tr.batch_size / tr.client_lr)
    # noise: local — every client adds the full σ(C + γ√d) to its own step: the same 6 clients' sum has 6× the variance
    stream = SecretStream.for_party(7, "client")
    local = sum(
        _flat(LocalDPSGD(clip_norm=CLIP, noise_multiplier=SIGMA, sample_rate=Q, divisor=1.0, stream=stream,
                         label=f"c{c}").finish({k: torch.zeros_like(v) for k, v in e.theta.items()}, "s0").values())
        for c in range(t)
    )  # fmt: skip
    _, corrected_theta = release_grid(CLIP, sum(v.numel() for v in e.theta.values()))
    ratio = local.var().item() / (SIGMA * corrected_theta) ** 2 / (noise.var().item() / central)
    assert ratio == pytest.approx(t, rel=2 * band)


def test_ledger_is_one_subsampled_gaussian_step_a_round_and_the_run_reports_a_finite_epsilon(tmp_path):
    """End to end with [dp, secure_aggregation]: the run completes; the instance unit took one step a round at (σ, q),
    and its ε is Opacus's for that history; the server's ε is the same, said to hold only with the secure sum."""
    rounds = 3
    s = Experiment(small_plan(*BASE, SHARES, f"training.rounds={rounds}"), run_dir=tmp_path).run(progress=False).summary
    assert s["status"] == "completed"
    unit = s["privacy"]["units"]["instance"]
    assert unit["steps"] == rounds and unit["noise_multiplier"] == SIGMA and unit["sample_rate"] == Q
    acc = RDPAccountant()
    acc.history = [(SIGMA, Q, rounds)]
    want = acc.get_epsilon(1e-5, alphas=[a for a in RDP_ORDERS if a.is_integer()])  # q < 1: the ledger's integer orders
    assert math.isfinite(float(unit["epsilon"])) and float(unit["epsilon"]) == pytest.approx(want, rel=1e-9)
    server = unit["adversaries"]["server"]
    assert float(server["epsilon"]) == pytest.approx(want, rel=1e-9) and "only with the secure sum" in server["why"]
    assert "only with the secure sum" in unit["sensitivity_note"]
    assert all(math.isfinite(float(v)) for v in s["final"].values() if isinstance(v, float))


def test_shares_train_the_model_from_the_noisy_sum(tmp_path):
    """The clients' replies are their noisy sums, not zero (their own model takes no step): θ moves in a round."""
    e = Experiment(small_plan(*BASE, SHARES, "training.rounds=1"), run_dir=tmp_path)
    before = _flat(e.theta.values()).clone()
    e.run(progress=False)
    assert not torch.allclose(_flat(e.theta.values()), before)


SHARES_SET = SHARES.split("=", 1)[1]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (['protocols=["dp"]'], "needs secure_aggregation after dp"),
        (['protocols=["dp", "ckks"]'], "CKKS decrypts approximately"),
        (["training.local_epochs=2"], "local_epochs 2 × round(1/privacy.local.batch_sample_rate 0.8) is 2 steps"),
        ([f"privacy.local={SHARES_SET.replace('batch_sample_rate: 0.8', 'batch_sample_rate: 0.5')}"], "is 2 steps"),
        (["training.client_optimizer=adam"], "use sgd with momentum 0"),
        (["training.client_momentum=0.9"], "use sgd with momentum 0"),
        ([f"privacy.local={SHARES_SET.replace('max_labels_per_instance: 1', 'max_labels_per_instance: 3')}"], "sensitivity 3C"),
        (['privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}'], "with privacy.client"),
        (["secure_aggregation.clip_range=10"], "would clip the clients' noise shares: under privacy.local.noise: shares"),
    ],
)
def test_bad_combinations_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=None) as info:
        small_config(*BASE, SHARES, *overrides)
    assert needle in str(info.value)


def test_a_bad_combination_is_one_error_line(tmp_path):
    ov = ["--set", 'protocols=["dp"]', "--set", "algorithm.name=fedaws", "--set", f"privacy.local={SHARES_SET}"]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], "privacy.local.noise: shares needs secure_aggregation")


def test_default_noise_is_local(tmp_path):
    """Unset, ``privacy.local.noise`` is ``local``: every client adds the full noise to each of its steps."""
    cfg = small_config("algorithm.name=fedaws", 'protocols=["dp"]',
                       "privacy.local={clip_norm: 1.0, noise_multiplier: 1.0, max_labels_per_instance: 8}")  # fmt: skip
    assert cfg.privacy.local.noise == "local"
    dp = Experiment(build_plan(cfg), run_dir=tmp_path).stack.by_name()["dp"]
    assert not dp.local_shares and type(dp.local_privatizer(0, 0)) is LocalDPSGD


def test_a_calibrated_sigma_whose_shares_the_encoding_would_clip_is_refused_when_the_layer_is_built(tmp_path):
    """σ unknown when the config is read (calibrated to target_epsilon): the dp layer checks the range with it."""
    calibrated = SHARES_SET.replace(f"noise_multiplier: {SIGMA}", "target_epsilon: 2")
    cfg = small_config(*BASE, f"privacy.local={calibrated}", "training.rounds=1", "secure_aggregation.clip_range=5")
    with pytest.raises(ConfigError, match=r"clip_range 5 would clip the clients' noise shares: under privacy.local"):
        Experiment(build_plan(cfg), run_dir=tmp_path)


def test_a_clipped_sum_beyond_the_encodings_room_is_clamped_before_the_share():
    """A client's clipped sum can exceed C (it sums a batch): each coordinate is clamped to ±(R − 10σ(C + γ√d)), so
    value plus share stays inside secure aggregation's range R (clamping is 1-Lipschitz: sensitivity stays C)."""
    from protocols.dp.local_shares import share_reply, sum_slack

    theta = {"w": torch.zeros(4, 5)}
    sums = {"w": torch.tensor([1e6, -1e6, 0.25, 0.0] * 5, dtype=torch.float64).reshape(4, 5)}
    R, sigma = 100.0, 2.0
    out = share_reply({"theta_delta": theta, "loss": 3.0}, sums, std=0.0, sigma=sigma, rows_shape=None,
                      stream=SecretStream.for_party(1, "c"), label="x", clip_norm=CLIP, finest_grid=2.0**-24,
                      clip_range=R)  # fmt: skip
    grid, corrected = release_grid(CLIP, 20, 2.0**-24, slack=sum_slack(CLIP))  # the sum's worst case in the std
    bound = R - 10 * sigma * corrected
    w = out["theta_delta"]["w"].flatten()  # on the public grid: within half a step of ∓bound
    assert w[0].item() == pytest.approx(-bound, abs=grid) and w[1].item() == pytest.approx(bound, abs=grid)
    assert w[2].item() == -0.25 and out["loss"] == 0.0
