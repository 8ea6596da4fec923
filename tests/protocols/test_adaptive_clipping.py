"""Adaptive clipping (``privacy.client.adaptive_clipping``, Andrew et al. 2021): the quantile tracking, the noise
split of Theorem 1 and its accounting, an end-to-end run with resume, and bad inputs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from opacus.accountants.analysis.rdp import compute_rdp

from protocols.dp import adaptive_clipping as ac
from protocols.dp import client_dp
from protocols.dp.accountant import epsilon_of
from protocols.dp.discrete_gaussian import noisy_sum
from protocols.dp.layer import DifferentialPrivacy
from protocols.randomness import SecretStream
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.config.test_bad_input import _default, assert_one_error_line, cli
from tests.conftest import small_plan


def _dp(exp: Experiment) -> DifferentialPrivacy:
    return next(layer for layer in exp.stack.layers if isinstance(layer, DifferentialPrivacy))


def _track(norms: np.ndarray, *, count_std: float, seed: int, lr: float = 0.2) -> list[float]:
    """C_t over a synthetic stream of update norms (one row of norms a round, cohort = expected size)."""
    clip = ac.AdaptiveClip(initial=0.01, target_quantile=0.5, learning_rate=lr, count_std=count_std,
                           expected_clients=norms.shape[1])  # fmt: skip
    stream = SecretStream.from_noise_seed(seed, "server")
    out = []
    for r, row in enumerate(norms):
        c = clip.open(r)
        out.append(c)
        clip.close(r, sum(ac.clip_bit(float(n), c) for n in row), stream, f"clip bit r{r}")
    return out


NORMS = np.random.default_rng(0).lognormal(mean=0.0, sigma=0.5, size=(400, 50))  # median 1.0


def test_clip_norm_converges_to_the_target_quantile_without_noise():
    c = _track(NORMS, count_std=0.0, seed=0)
    median = float(np.median(NORMS))
    assert abs(c[0] - median) > 0.9 * median  # starts far away (0.01)
    assert all(abs(x - median) < 0.1 * median for x in c[-100:])


def test_clip_norm_tracks_the_quantile_in_expectation_with_noise():
    median = float(np.median(NORMS))
    logs = [np.mean(np.log(_track(NORMS, count_std=5.0, seed=s)[-200:])) for s in range(5)]
    assert abs(math.exp(np.mean(logs)) - median) < 0.1 * median


def test_noisy_fraction_has_the_count_noise_of_std_sigma_b_over_the_expected_cohort():
    """b̃ = (Σ b + N(0, σ_b²))/m̄ + 1/2: mean the true fraction, std σ_b/m̄ (dropping the noise, or drawing it at
    another scale, fails here)."""
    clip = ac.AdaptiveClip(initial=1.0, target_quantile=0.5, learning_rate=0.2, count_std=3.0, expected_clients=20.0)
    stream = SecretStream.from_noise_seed(1, "server")
    b = np.array([clip.noisy_fraction(4.0, stream, f"x{i}") for i in range(4000)])
    assert b.mean() == pytest.approx(4.0 / 20 + 0.5, abs=0.01)
    assert b.std() == pytest.approx(3.0 / 20, rel=0.05)


def test_update_noise_multiplier_makes_the_round_one_gaussian_at_sigma():
    """σ_Δ against an independent computation: the Rényi divergences of the update's Gaussian (multiplier σ_Δ) and
    the count's (sensitivity 1/2, std σ_b: multiplier 2σ_b) add up to those of one Gaussian at σ, at every order."""
    orders = [1.5, 2.0, 4.0, 8.0, 32.0, 128.0]
    for sigma, sb in [(1.0, 0.6), (1.0, 5.0), (0.7, 10.0), (3.0, 2.0)]:
        sd = ac.update_noise_multiplier(sigma, sb)
        assert sd > sigma
        both = compute_rdp(q=1.0, noise_multiplier=sd, steps=1, orders=orders) + compute_rdp(
            q=1.0, noise_multiplier=2 * sb, steps=1, orders=orders
        )
        assert both == pytest.approx(compute_rdp(q=1.0, noise_multiplier=sigma, steps=1, orders=orders), rel=1e-9)
    with pytest.raises(ValueError, match="must exceed σ/2"):
        ac.update_noise_multiplier(1.0, 0.5)


ADAPTIVE = [
    'protocols=["dp"]',
    "algorithm.name=fedavg",
    'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.05, '
    '"adaptive_clipping": {"count_noise_multiplier": 2.0, "learning_rate": 0.5}}',
]


def test_a_run_releases_a_changing_clip_norm_and_charges_one_gaussian_at_sigma(tmp_path):
    ov = [*ADAPTIVE, "training.rounds=5", "training.client_fraction=0.5", "training.sampling=poisson"]
    s = Experiment(small_plan(*ov), run_dir=tmp_path).run(progress=False).summary
    assert s["status"] == "completed"
    client = s["privacy"]["units"]["client"]
    assert math.isfinite(client["epsilon"]) and client["steps"] == 5
    # the ledger: 5 subsampled Gaussians at the combined σ = 1.0, not at σ_Δ
    assert client["epsilon"] == pytest.approx(epsilon_of([(1.0, 0.5, 5)], 1e-5, "rdp"), rel=1e-12)
    assert client["adaptive_clipping"]["update_noise_multiplier"] == pytest.approx(ac.update_noise_multiplier(1.0, 2.0))
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    released = [x["privacy"]["client"]["clip_norm"] for x in lines]
    assert released == client["adaptive_clipping"]["clip_norm_by_round"] and released[0] == 0.05
    assert len(set(released)) == 5


def test_the_next_clip_norm_divides_the_noisy_count_by_the_expected_cohort(tmp_path, monkeypatch):
    """One round under Poisson sampling: C_1 = C_0·exp(−η((Σ b + z)/(qN) + 1/2 − γ)) with the realised cohort's bits
    and the server's draw z, divided by the public qN (not the realised count, which differs here)."""
    bits = []
    real = client_dp.clip_bit
    monkeypatch.setattr(client_dp, "clip_bit", lambda n, c: bits.append(real(n, c)) or bits[-1])
    ov = [*ADAPTIVE, "training.client_fraction=0.3", "training.sampling=poisson", "privacy.noise_seed=3"]
    e = Experiment(small_plan(*ov), run_dir=tmp_path)
    e.setup()
    e.train_round()
    dp = _dp(e)
    m = 0.3 * len(e.fed.clients)
    assert len(bits) != m and bits  # the realised cohort is not the expected one (not a whole number): the divisor matters
    zero = torch.zeros(1, dtype=torch.float64)
    z = float(noisy_sum(zero, sigma=2 * 2.0, sensitivity=0.5, stream=dp.server_stream, label="clip bit r0")[0])
    b = (sum(bits) + z) / m + 0.5
    assert dp.adaptive[0].next_clip == pytest.approx(0.05 * math.exp(-0.5 * (b - 0.5)), rel=1e-12)


def test_resume_restores_the_clip_norm_exactly(tmp_path):
    ov = [*ADAPTIVE, "training.rounds=6", "output.checkpoint_every=3", "privacy.noise_seed=5"]
    full = Experiment(small_plan(*ov), run_dir=tmp_path / "full").run(progress=False).summary
    Experiment(small_plan(*ov, "training.rounds=3"), run_dir=tmp_path / "part").run(progress=False)
    e = Experiment(small_plan(*ov), run_dir=tmp_path / "part")
    assert e.resume()
    resumed = e.run(progress=False).summary
    a, b = (x["privacy"]["units"]["client"]["adaptive_clipping"] for x in (full, resumed))
    assert a["clip_norm_by_round"] == b["clip_norm_by_round"] and a["next_clip_norm"] == b["next_clip_norm"]
    assert len(set(a["clip_norm_by_round"])) == 6


def test_a_forged_clip_bit_is_refused(tmp_path, monkeypatch):
    """The count's sensitivity is 1/2 only if every bit is ±1/2: a client that reports another value is refused."""
    real = client_dp.clip_bit
    monkeypatch.setattr(client_dp, "clip_bit", lambda n, c: 10 * real(n, c))
    e = Experiment(small_plan(*ADAPTIVE), run_dir=tmp_path)
    e.setup()
    with pytest.raises(Exception, match="clip bit"):
        e.train_round()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (['privacy.client={"noise_multiplier": 1.0, "adaptive_clipping": {"count_noise_multiplier": 0.5}}'],
         "must exceed noise_multiplier/2"),
        (['privacy.client={"noise_multiplier": 1.0, "adaptive_clipping": {"count_noise_multiplier": 2.0, '
          '"target_quantile": 1.0}}'], "target_quantile"),
        (['privacy.client={"noise_multiplier": 1.0, "adaptive_clipping": {"count_noise_multiplier": 2.0, '
          '"learning_rate": 0}}'], "learning_rate"),
        (['privacy.client={"noise_multiplier": 1.0, "adaptive_clipping": {}}'], "count_noise_multiplier"),
        (['privacy.client={"noise_multiplier": 1.0, "noise": "clients", "adaptive_clipping": '
          '{"count_noise_multiplier": 2.0}}', 'protocols=["dp", "secure_aggregation"]'], "secure sum"),
        (['privacy.client={"noise_multiplier": 1.0, "adaptive_clipping": {"count_noise_multiplier": 2.0}}',
          'protocols=["dp", "secure_aggregation"]'], "secure sum"),
    ],
    ids=["sigma_b<=sigma/2", "quantile", "lr", "missing", "noise-clients", "secagg"],
)  # fmt: skip
def test_bad_adaptive_clipping_settings_are_one_error_line(tmp_path, extra, needle):
    ov = ["--set", 'protocols=["dp"]', "--set", "training.rounds=1"]
    for x in extra:
        ov += ["--set", x]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], needle)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], needle)
    assert not out.exists()


def test_a_calibrated_sigma_that_leaves_no_update_noise_is_refused(tmp_path):
    ov = ['protocols=["dp"]', "training.rounds=2",
          'privacy.client={"target_epsilon": 1.0, "adaptive_clipping": {"count_noise_multiplier": 0.01}}']  # fmt: skip
    with pytest.raises(ConfigError, match="must exceed σ/2"):
        Experiment(small_plan(*ov), run_dir=tmp_path).setup()


def test_the_update_is_noised_at_sigma_delta_with_this_rounds_clip_norm(tmp_path, monkeypatch):
    from protocols.dp import client_release

    seen = []
    real = client_release.noise_aggregate
    monkeypatch.setattr(client_release, "noise_aggregate", lambda agg, **kw: seen.append(kw) or real(agg, **kw))
    e = Experiment(small_plan(*ADAPTIVE), run_dir=tmp_path)
    e.setup()
    e.train_round()
    e.train_round()
    clip = _dp(e).adaptive[0]
    assert [kw["noise_multiplier"] for kw in seen] == [ac.update_noise_multiplier(1.0, 2.0)] * 2
    assert [kw["clip_norm"] for kw in seen] == [clip.by_round[0], clip.by_round[1]] and clip.by_round[0] != clip.by_round[1]
