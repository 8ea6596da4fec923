"""The discrete Gaussian sampler behind every DP draw (:mod:`protocols.dp.discrete_gaussian`): its law against the exact
pmf (χ², moments, tails, computed independently with mpmath), its reproducibility from key and label, the grid the
released values lie on at each call site (server W step, client-level server noise, noise shares, DP-SGD), and the
grid correction of the accounting.

The streams here have fixed keys, so every statistic is a fixed number: the thresholds are a 1e-4 p-value or 5
standard errors, and they held for every key tried while writing them (a fresh key would make them flaky, not weaker)."""

from __future__ import annotations

import inspect
import math

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats

import protocols.dp as dp_pkg
from protocols.dp import accountant
from protocols.dp import discrete_gaussian as dg
from protocols.dp.accountant import GRID_CORRECTION_BITS, grid_corrected_std, grid_sensitivity, noise_grid
from protocols.dp.client_dp import add_client_noise, noise_aggregate
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.randomness import SecretStream
from protocols.secagg.encoding import FixedPoint
from secure_fed.engine.aggregation import Aggregate
from tests.conftest import small_plan


def _stream(i: int = 1) -> SecretStream:
    return SecretStream(bytes([i]) * 32)


def _exact_pmf(sigma: float, radius: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, P(y)) for |y| ≤ radius of N_Z(0, σ²), normalised over |y| ≤ 60σ + 60 in 50-digit arithmetic."""
    mpmath.mp.dps = 50
    s2 = 2 * mpmath.mpf(sigma) ** 2
    far = int(60 * sigma) + 60
    norm = mpmath.fsum(mpmath.exp(-(mpmath.mpf(y) ** 2) / s2) for y in range(-far, far + 1))
    ys = np.arange(-radius, radius + 1)
    return ys, np.array([float(mpmath.exp(-(mpmath.mpf(int(y)) ** 2) / s2) / norm) for y in ys])


def _exact_moment(sigma: float, k: int) -> float:
    mpmath.mp.dps = 50
    s2, far = 2 * mpmath.mpf(sigma) ** 2, int(60 * sigma) + 60
    w = [mpmath.exp(-(mpmath.mpf(y) ** 2) / s2) for y in range(-far, far + 1)]
    return float(mpmath.fsum(wi * mpmath.mpf(y) ** k for wi, y in zip(w, range(-far, far + 1), strict=True)) / mpmath.fsum(w))


@pytest.mark.parametrize("sigma", [0.6, 1.0, 3.7, 12.0])
def test_chi_square_against_the_exact_pmf(sigma):
    n = 300_000
    z = dg.sample_discrete_gaussian(_stream(), n, sigma, f"chi2 {sigma}")
    assert z.dtype == np.int64
    ys, p = _exact_pmf(sigma, int(6 * sigma) + 3)
    keep = p * n >= 5  # bins with at least 5 expected draws, the rest pooled into two tail bins
    lo, hi = ys[keep].min(), ys[keep].max()
    observed = np.array([np.sum(z < lo), *[np.sum(z == y) for y in range(lo, hi + 1)], np.sum(z > hi)])
    tail = (1.0 - p[keep].sum()) / 2  # the pmf is symmetric: each tail holds half the rest
    expected = n * np.array([tail, *p[keep], tail])
    if tail * n < 5:  # merge tails too thin to test into their neighbours
        observed = np.array([observed[0] + observed[1], *observed[2:-2], observed[-2] + observed[-1]])
        expected = np.array([expected[0] + expected[1], *expected[2:-2], expected[-2] + expected[-1]])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(chi2, len(observed) - 1) > 1e-4, chi2


@pytest.mark.parametrize("sigma", [0.8, 5.0, 1.0e6])
def test_mean_variance_and_kurtosis_match_the_discrete_gaussian(sigma):
    n = 400_000
    z = dg.sample_discrete_gaussian(_stream(2), n, sigma, "moments").astype(np.float64)
    var = _exact_moment(sigma, 2) if sigma < 100 else sigma**2  # within 1e-400 of σ² for large σ (Poisson summation)
    m4 = _exact_moment(sigma, 4) if sigma < 100 else 3 * sigma**4
    assert abs(z.mean()) < 5 * math.sqrt(var / n)
    se_var = math.sqrt((m4 - var**2) / n)
    assert abs(z.var() - var) < 5 * se_var
    assert abs(np.mean(z**4) / var**2 - m4 / var**2) < 0.05 * m4 / var**2
    assert abs(stats.skew(z)) < 5 * math.sqrt(6 / n)


@pytest.mark.parametrize("sigma", [1.5, 40.0])
def test_tails_have_the_exact_mass(sigma):
    """P(|Z| ≥ kσ) for k = 2, 3, 4 against the exact pmf (binomial, 5 standard errors), on 10^6 draws: no truncated,
    thinned or fattened tail (Box–Muller reached 8.7σ at most; here the Bernoulli chains have no floor)."""
    n = 1_000_000
    z = np.abs(dg.sample_discrete_gaussian(_stream(3), n, sigma, "tails"))
    ys, p = _exact_pmf(sigma, int(12 * sigma) + 2)
    for k in (2.0, 3.0, 4.0):
        q = float(p[np.abs(ys) >= k * sigma].sum())
        count = int((z >= k * sigma).sum())
        assert abs(count - n * q) < 5 * math.sqrt(n * q * (1 - q)) + 1, (k, count, n * q)
    assert z.max() < 7 * sigma  # P(any |Z| ≥ 7σ in 10^6) < 10^-4


def test_bernoulli_exp_chains_trials_for_large_x():
    """Bern(e^{−x}) for x > 4 is a product of ⌈x/4⌉ trials: its frequency matches e^{−x} (binomial, 5 SE)."""
    n = 400_000
    for x in (0.3, 1.0, 2.5, 6.2, 9.5):
        hits = dg.bernoulli_exp(dg._Words(_stream(4), f"bern {x}"), np.full(n, x)).sum()
        p = math.exp(-x)
        assert abs(hits - n * p) < 5 * math.sqrt(n * p * (1 - p)) + 1, (x, hits, n * p)


def test_discrete_laplace_has_its_exact_law():
    n, t = 300_000, 3
    y = dg.discrete_laplace(dg._Words(_stream(5), "lap"), n, t)
    ys = np.arange(-12, 13)
    p = np.exp(-np.abs(ys) / t) * (1 - math.exp(-1 / t)) / (1 + math.exp(-1 / t))
    observed = np.array([np.sum(y == v) for v in ys])
    chi2 = float(((observed - y.size * p) ** 2 / (y.size * p)).sum())
    assert stats.chi2.sf(chi2, len(ys)) > 1e-4  # the 25 bins hold all but 1.7% (not tested) of the mass


def test_draws_are_reproducible_from_key_and_label_and_independent_across_labels():
    s = _stream(6)
    a = dg.sample_discrete_gaussian(s, 50_000, 9.5, "a")
    assert np.array_equal(a, dg.sample_discrete_gaussian(SecretStream.from_state_dict(s.state_dict()), 50_000, 9.5, "a"))
    b = dg.sample_discrete_gaussian(s, 50_000, 9.5, "b")
    other_key = dg.sample_discrete_gaussian(_stream(7), 50_000, 9.5, "a")
    for c in (b, other_key):
        assert not np.array_equal(a, c)
        assert abs(np.corrcoef(a, c)[0, 1]) < 5 / math.sqrt(50_000)
    # a prefix of a longer draw is not promised (blocks of candidates), but a draw of n is a function of (key, label, n)
    assert np.array_equal(dg.sample_discrete_gaussian(s, 10, 9.5, "a"), dg.sample_discrete_gaussian(s, 10, 9.5, "a"))
    assert not dg.sample_discrete_gaussian(s, 10, 0.0, "a").any()


def test_snap_and_noise_releases_exact_grid_values_with_the_given_std():
    grid = 2.0**-12
    x = torch.randn(200, 300) * 3  # float32, most values off the grid
    std = 0.25
    out = dg.snap_and_noise(x, std, grid, _stream(8), "snap")
    assert out.dtype == torch.float64 and out.shape == x.shape and dg.on_grid(out, grid)
    noise = out - dg.snap(x, grid)
    assert dg.on_grid(noise, grid)
    assert abs(float(noise.std()) - std) < 5 * std / math.sqrt(2 * noise.numel())
    assert float((dg.snap(x, grid) - x.double()).abs().max()) <= grid / 2
    assert not dg.on_grid(x.double() + torch.randn(x.shape, dtype=torch.float64) * std, grid)  # the check has power
    with pytest.raises(ValueError, match="power of two"):
        dg.snap_and_noise(x, std, 0.001, _stream(8), "snap")
    with pytest.raises(ValueError, match="2\\^52"):
        dg.snap(torch.tensor([1.0e6]), 2.0**-40)


def test_grid_correction_bounds_the_rounded_sensitivity():
    """noise_grid: a power of two with γ√d ≤ 2^-10·Δ < 2γ√d; rounding two neighbouring sums (worst case: every
    coordinate rounded the other way) moves them apart by at most γ√d; the noise std is σ·(Δ + γ√d)."""
    for delta, d in [(2000.0, 159 * 512), (1.0, 3_450_000), (0.5, 1000), (1.0, 4)]:
        g = noise_grid(delta, d)
        assert math.frexp(g)[0] == 0.5
        assert g * math.sqrt(d) <= delta * 2.0**-GRID_CORRECTION_BITS < 2 * g * math.sqrt(d)
        assert grid_corrected_std(2.0, delta, g, d) == pytest.approx(2.0 * (delta + g * math.sqrt(d)))
    assert noise_grid(1.0, 3_450_000, coarsest_below=2.0**-16) == 2.0**-16
    d, g = 10_000, 2.0**-8
    x = torch.full((d,), 0.5 * g - 1e-9, dtype=torch.float64)  # rounds down to 0
    y = x + torch.full((d,), 2e-9, dtype=torch.float64)  # rounds up to γ: ‖x − y‖ = 2e-7, rounded apart by γ√d
    gap = float((dg.snap(x, g) - dg.snap(y, g)).norm())
    assert gap <= grid_sensitivity(float((x - y).norm()), g, d) and gap == pytest.approx(g * math.sqrt(d))


def test_distributed_tau_is_kairouz_liu_steinke():
    assert dg.distributed_tau(0.5, 3) == pytest.approx(10 * (math.exp(-(math.pi**2) / 4) + math.exp(-(math.pi**2) / 3)))
    assert dg.distributed_tau(0.5, 1) == 0.0
    assert dg.distributed_tau(10.0, 1000) == 0.0  # below double precision at every share std secure-fed uses


# ---------------------------------------------------------------- the call sites release grid values


@pytest.fixture(params=[GRID_CORRECTION_BITS, -3], ids=["grid", "coarse-grid"])
def correction_bits(request, monkeypatch):
    """The configured grid, and a coarse one (γ√d up to 8Δ: the std then shows whether the correction is applied)."""
    monkeypatch.setattr(accountant, "GRID_CORRECTION_BITS", request.param)
    return request.param


def test_server_noise_on_client_level_sums_is_on_the_grid(correction_bits):
    theta = {"w": torch.randn(40, 30, dtype=torch.float64), "b": torch.randn(30, dtype=torch.float64)}
    rows = torch.randn(7, 5, dtype=torch.float64)
    agg = Aggregate(theta_sum={n: t.clone() for n, t in theta.items()}, weight_sum=3.0, row_sum=rows.clone(),
                    row_count=torch.ones(7), loss_sum=0.0, num_clients=3)  # fmt: skip
    S, sigma = 0.5, 2.0
    noise_aggregate(agg, clip_norm=S, noise_multiplier=sigma, expected_clients=3.0, expected_per_row=torch.ones(7),
                    noise_rows=True, stream=_stream(9), label="client noise r0")  # fmt: skip
    d = 40 * 30 + 30 + 35
    grid = noise_grid(S, d)
    assert all(dg.on_grid(t, grid) for t in [*agg.theta_sum.values(), agg.row_sum])
    noise = torch.cat([(agg.theta_sum[n] - dg.snap(theta[n], grid)).flatten() for n in theta])
    std = grid_corrected_std(sigma, S, grid, d)
    assert abs(float(noise.std()) - std) < 5 * std / math.sqrt(2 * noise.numel())


def test_noise_shares_are_on_the_grid_and_pass_the_encoding_exactly():
    """Each client's update and share are multiples of γ ≥ 2^-frac_bits: secure aggregation's fixed point carries
    them exactly, so the decoded sum is γ·(Σ rounded updates + Σ Z_c) to the bit."""
    S, frac_bits = 0.5, 12  # 2^-12 is coarser than the grid the sensitivity alone gives (2^-16): it binds
    codec = FixedPoint(clip_range=64.0, frac_bits=frac_bits, modulus_bits=64)
    replies, total = [], None
    for c in range(4):
        reply = {"theta_delta": {"w": torch.randn(30, 20) * 0.01}, "rows_delta": torch.randn(2, 6) * 0.01,
                 "row_ids": torch.tensor([1, 4]), "loss": 0.0, "num_examples": 1}  # fmt: skip
        out = add_client_noise(reply, std=0.2, rows_shape=(5, 6), stream=_stream(10 + c), label="noise share r0",
                               clip_norm=S, finest_grid=2.0**-frac_bits)  # fmt: skip
        grid, _ = dg.release_grid(S, 30 * 20 + 5 * 6, 2.0**-frac_bits)
        assert grid == 2.0**-frac_bits
        for t in (out["theta_delta"]["w"], out["rows_delta"], out["row_noise"]):
            assert t.dtype == torch.float64 and dg.on_grid(t, grid)
        flat = torch.cat([out["theta_delta"]["w"].flatten(), out["row_noise"].flatten()]).numpy()
        enc = codec.encode(flat)
        total = enc if total is None else total + enc
        replies.append(flat)
    assert np.array_equal(codec.decode_sum(total), np.sum(replies, axis=0))


@pytest.mark.parametrize("finest", [None, 2.0**-4])
def test_noise_share_std_carries_the_grid_correction(finest):
    """With an encoding as coarse as 2^-4 the correction (S + γ√d)/S is 29: the share's std must carry it."""
    S, std, d = 0.5, 0.2, 50_000
    reply = {"theta_delta": {"w": torch.zeros(d)}, "loss": 0.0, "num_examples": 1}
    out = add_client_noise(reply, std=std, rows_shape=None, stream=_stream(20), label="share", clip_norm=S,
                           finest_grid=finest)  # fmt: skip
    grid = dg.release_grid(S, d, finest)[0]
    want = std * (S + grid * math.sqrt(d)) / S  # the grid-corrected share, written out
    assert grid == (finest or noise_grid(S, d))
    assert dg.on_grid(out["theta_delta"]["w"], grid)
    assert abs(float(out["theta_delta"]["w"].std()) - want) < 5 * want / math.sqrt(2 * d)


def test_dp_sgd_step_releases_grid_values_before_the_public_divisor(correction_bits):
    C, sigma, d = 1.0, 1.5, 30_000
    sums = {"a": torch.randn(100, 200, dtype=torch.float64), "b": torch.randn(10_000, dtype=torch.float64)}
    priv = LocalDPSGD(clip_norm=C, noise_multiplier=sigma, sample_rate=0.5, divisor=1.0, stream=_stream(21), label="r0")
    out = priv.finish(sums, "e0 s0")
    grid = noise_grid(C, d)
    assert all(dg.on_grid(out[n], grid) for n in sums)
    noise = torch.cat([(out[n] - dg.snap(sums[n], grid)).flatten() for n in sorted(sums)])
    want = sigma * (C + grid * math.sqrt(d))  # σ·(C + γ√d), written out
    assert abs(float(noise.std()) - want) < 5 * want / math.sqrt(2 * d)


def test_the_server_w_step_releases_grid_values(monkeypatch, tmp_path):
    """The dp layer's W step forms its noisy sum with :func:`noisy_sum` (recorded here): on the grid of Δ = 2C."""
    from protocols.dp import w_step_release
    from secure_fed.engine import Experiment

    released = []

    def recording(total, **kw):
        out = dg.noisy_sum(total, **kw)
        released.append((out, kw["sensitivity"], total.numel()))
        return out

    monkeypatch.setattr(w_step_release, "noisy_sum", recording)
    e = Experiment(small_plan("protocols=[dp]", "training.rounds=1", "algorithm.normalize_gamma=false",
                                'privacy.instance={"noise_multiplier": 1.0, "clip_norm": 0.7, "sample_rate": 0.5}'),
                   run_dir=tmp_path)  # fmt: skip
    e.setup()
    e.train_round()
    assert released, "the W step drew no discrete Gaussian noise"
    for out, sens, d in released:
        assert sens == pytest.approx(2 * 0.7)
        assert dg.on_grid(out, noise_grid(sens, d))


def test_no_dp_module_draws_floating_point_gaussians():
    """Box–Muller (``SecretStream.gaussian``) stays for CKKS's decryption noise and the benchmark: no DP module calls it."""
    import pkgutil

    for mod in pkgutil.iter_modules(dp_pkg.__path__):
        src = inspect.getsource(__import__(f"protocols.dp.{mod.name}", fromlist=["_"]))
        assert ".gaussian(" not in src and "randn" not in src, mod.name


def test_a_noise_share_of_a_few_grid_steps_is_refused():
    """Below 6 grid steps (a coarse encoding, a small share) the sum of discrete Gaussian shares is not provably a
    discrete Gaussian to double precision (KLS 2021's τ), which the ledger's curve assumes: the client refuses to send
    its update (one line naming frac_bits)."""
    from secure_fed.errors import SecureFedError

    reply = {"theta_delta": {"w": torch.zeros(100)}, "loss": 0.0, "num_examples": 1}
    out = add_client_noise(reply, std=0.1, rows_shape=None, stream=_stream(30), label="s", clip_norm=1.0, finest_grid=2.0**-6)
    assert dg.on_grid(out["theta_delta"]["w"], 2.0**-6)  # 0.1·(1 + 2^-6·√100) / 2^-6 = 7.4 steps
    with pytest.raises(SecureFedError, match="frac_bits") as err:  # 2^-5: 4.2 steps
        add_client_noise(reply, std=0.1, rows_shape=None, stream=_stream(30), label="s", clip_norm=1.0, finest_grid=2.0**-5)
    assert "\n" not in str(err.value)
    assert dg.distributed_tau(6.0, 10**6) < 1e-140
