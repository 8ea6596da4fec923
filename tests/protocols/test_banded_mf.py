"""Banded matrix factorisation for client-level DP (privacy.client.mechanism: banded): the strategy's algebra, the
noise recursion against dense algebra, the sensitivity against a brute force over participation patterns, the ε
against dp_accounting, the server's exact release and its resume, a run end to end, and the bad inputs."""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from protocols.dp.accountant import epsilon_of
from protocols.dp.banded_ledger import BandedUnit, ClientBanded
from protocols.dp.banded_mf import (
    InverseRecursion,
    band_coefficients,
    lattice_bits,
    noise_recursion,
    prefix_workload,
    sensitivity,
    sqrt_coefficients,
    strategy_matrix,
    theorem_error,
)
from protocols.dp.banded_release import BandedNoise
from protocols.dp.discrete_gaussian import grid_noise, on_grid, release_grid, snap
from protocols.randomness import SecretStream
from secure_fed.engine import Experiment
from secure_fed.engine.sampling import sample_clients
from tests.config.test_bad_input import _default, assert_one_error_line, cli
from tests.conftest import small_plan


# ---------------------------------------------------------------- (1) the strategy matrix and its recursion
def _toeplitz_fractions(n: int, coeffs: list[Fraction]) -> list[list[Fraction]]:
    return [[coeffs[i - j] if 0 <= i - j < len(coeffs) else Fraction(0) for j in range(n)] for i in range(n)]


def test_the_coefficients_are_binom_2k_k_over_4_to_the_k_and_dyadic():
    assert sqrt_coefficients(6) == [1, Fraction(1, 2), Fraction(3, 8), Fraction(5, 16), Fraction(35, 128), Fraction(63, 256)]
    for b in range(1, 17):
        c = band_coefficients(b)
        assert [Fraction(float(x)) for x in c] == sqrt_coefficients(b)  # float64 holds them exactly
        v = lattice_bits(b)
        assert all((Fraction(x) * 2**v).denominator == 1 for x in sqrt_coefficients(b))  # C maps γℤ into (γ/2^v)ℤ
        assert v == 2 * (b - 1) - bin(b - 1).count("1")


def test_the_unbanded_square_root_squares_to_the_prefix_sum_workload_exactly():
    for n in range(1, 25):
        C = _toeplitz_fractions(n, sqrt_coefficients(n))
        CC = [[sum(C[i][k] * C[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
        assert CC == [[Fraction(1) if j <= i else Fraction(0) for j in range(n)] for i in range(n)]
        assert np.array_equal(strategy_matrix(n) @ strategy_matrix(n), prefix_workload(n))
    # banded, it is no longer a square root (the truncation), but still lower triangular with b diagonals
    C4 = strategy_matrix(10, 4)
    assert not np.allclose(C4 @ C4, prefix_workload(10))
    assert np.array_equal(C4, np.tril(C4)) and not np.any(np.tril(C4, -4))


@pytest.mark.parametrize("bands", [1, 2, 3, 4, 8, 16])
def test_the_noise_recursion_is_the_dense_inverse(bands):
    n, d = 40, 5
    z = np.random.default_rng(bands).normal(size=(n, d))
    zhat = np.stack(noise_recursion(list(z), bands))
    dense = np.linalg.solve(strategy_matrix(n, bands), z)
    assert np.allclose(zhat, dense, rtol=0, atol=1e-10)
    assert np.allclose(strategy_matrix(n, bands) @ zhat, z, rtol=0, atol=1e-10)
    rec = InverseRecursion(band_coefficients(bands))  # O(b·d) memory: only the last b − 1 outputs are kept
    for row in z:
        rec.step(row)
    assert len(rec.past) == bands - 1
    # and with torch tensors, as the release uses it
    t = torch.from_numpy(z)
    assert torch.allclose(torch.stack(noise_recursion(list(t), bands)), torch.from_numpy(dense), rtol=0, atol=1e-10)


# ---------------------------------------------------------------- (2) the sensitivity against a brute force
def _patterns(n: int, sep: int) -> list[tuple[int, ...]]:
    """Every non-empty set of rounds in [0, n) with any two at least ``sep`` apart."""
    out = []
    for r in range(1, n + 1):
        for combo in itertools.combinations(range(n), r):
            if all(b - a >= sep for a, b in zip(combo, combo[1:], strict=False)):
                out.append(combo)
    return out


def _brute_force(n: int, bands: int, sep: int) -> float:
    """max ‖C·x‖ over every participation pattern with rounds ≥ ``sep`` apart and every x with x_i ∈ {−1, +1} on the
    pattern and 0 elsewhere (d = 1: ‖Cx‖ is convex, so its maximum over the box [−1, 1]^π is at a vertex). Built
    from the coefficients directly, not from the module's matrix."""
    c = [math.comb(2 * k, k) / 4**k for k in range(bands)]
    C = np.array([[c[i - j] if 0 <= i - j < bands else 0.0 for j in range(n)] for i in range(n)])
    best = 0.0
    for pat in _patterns(n, sep):
        for signs in itertools.product((-1.0, 1.0), repeat=len(pat)):
            x = np.zeros(n)
            x[list(pat)] = signs
            best = max(best, float(np.linalg.norm(C @ x)))
    return best


@pytest.mark.parametrize(("n", "bands", "period"), [(8, 2, 2), (9, 2, 3), (12, 3, 3), (12, 4, 4), (10, 4, 5), (11, 3, 4),
                                                    (7, 1, 1), (12, 2, 5), (6, 3, 3)])  # fmt: skip
def test_the_sensitivity_is_the_brute_force_maximum(n, bands, period):
    """Theorem 2: over the patterns with rounds ≥ P ≥ b apart, max ‖Cx‖ ≤ √k·max‖C[:, i]‖, k = ⌈n/P⌉ the most
    rounds such a pattern holds; equal when a k-round pattern fits with full columns ((k−1)P + b ≤ n)."""
    k = math.ceil(n / period)
    assert max(len(p) for p in _patterns(n, period)) == k
    brute = _brute_force(n, bands, period)
    sens = sensitivity(n, bands, period)
    assert brute <= sens * (1 + 1e-12)
    if (k - 1) * period + bands <= n:
        assert brute == pytest.approx(sens, rel=1e-12)


def test_bands_above_the_period_break_the_theorem_and_are_refused():
    """Rounds closer than b: two contributions in one row of C add up, so the brute force exceeds √k·max‖C[:, i]‖;
    the module refuses the configuration instead of reporting the too-small value."""
    n, bands, period = 10, 4, 2
    k = math.ceil(n / period)
    col = math.sqrt(sum((math.comb(2 * j, j) / 4**j) ** 2 for j in range(bands)))
    assert _brute_force(n, bands, period) > math.sqrt(k) * col * 1.2
    assert theorem_error(bands, period) is not None
    with pytest.raises(ValueError, match="Theorem 2"):
        sensitivity(n, bands, period)
    with pytest.raises(ValueError, match="Theorem 2"):
        ClientBanded(bands=bands, period=period, name="client", sigma=1.0, sample_rate=1.0)


def test_the_engine_s_cyclic_schedule_is_the_one_accounted():
    """Each client's rounds under training.sampling: cyclic are P apart, ⌈(n − g)/P⌉ ≤ ⌈n/P⌉ of them: a pattern of
    the theorem's set."""
    num_clients, period, rounds = 11, 4, 14
    sizes = np.ones(num_clients)
    rounds_of = {c: [] for c in range(num_clients)}
    for r in range(rounds):
        for c in sample_clients(sizes, 1 / period, "cyclic", seed=0, round_idx=r):
            rounds_of[int(c)].append(r)
    for c, rs in rounds_of.items():
        assert rs == list(range(c % period, rounds, period))
        assert all(b - a == period for a, b in zip(rs, rs[1:], strict=False)) and len(rs) <= math.ceil(rounds / period)


# ---------------------------------------------------------------- (3) the ε
def _independent_sens(rounds: int, bands: int, period: int) -> float:
    col = math.sqrt(sum((math.comb(2 * j, j) / 4**j) ** 2 for j in range(min(bands, rounds))))
    return math.sqrt(math.ceil(rounds / period)) * col


def _analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """ε with δ(ε) = Φ(μ/2 − ε/μ) − e^ε·Φ(−μ/2 − ε/μ) = ``delta`` for the Gaussian of sensitivity/σ = μ (bisection)."""
    from scipy.stats import norm

    def d(eps):
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)

    lo, hi = 0.0, 1.0
    while d(hi) > delta:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize(("sigma", "rounds", "bands", "period"), [(2.0, 60, 4, 4), (5.0, 100, 8, 10), (1.0, 12, 2, 3)])
def test_the_ledger_is_one_gaussian_at_sigma_over_sens_and_matches_dp_accounting(sigma, rounds, bands, period):
    u = BandedUnit(bands=bands, period=period, name="client", scope="s", sigma=sigma, sample_rate=1.0, delta=1e-5,
                   accountant="rdp", target_epsilon=None, clip_norm=1.0, calibrated=False, planned_steps=rounds)  # fmt: skip
    for _ in range(rounds):
        u.step()
    mu = sigma / _independent_sens(rounds, bands, period)
    assert u.accountant.history == [(pytest.approx(mu, rel=1e-12), 1.0, 1)]
    rdp = rdp_privacy_accountant.RdpAccountant(orders=[1 + x / 20 for x in range(1, 200)] + list(range(11, 512)))
    rdp.compose(dp_event.GaussianDpEvent(mu))
    pld = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_event.GaussianDpEvent(mu))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours_rdp = u.epsilon()
        ours_pld = epsilon_of(u.accountant.history, 1e-5, "pld")
        ours_prv = epsilon_of(u.accountant.history, 1e-5, "prv")
    assert ours_rdp == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-2)
    assert ours_pld == pytest.approx(pld.get_epsilon(1e-5), rel=1e-2)
    assert ours_prv == pytest.approx(pld.get_epsilon(1e-5), rel=2e-2)
    # the Gaussian mechanism's exact (ε, δ) curve (Balle & Wang 2018, Thm 8) at sensitivity/σ = 1/μ, solved for ε
    assert ours_pld == pytest.approx(_analytic_gaussian_epsilon(1 / mu, 1e-5), rel=1e-2)
    assert ours_rdp >= _analytic_gaussian_epsilon(1 / mu, 1e-5)  # RDP's conversion is an upper bound
    # the declared mechanism composes the same Gaussian in the graph (RDP curve α·sens²/(2σ²))
    m = u.mechanism()
    assert m.kind == "client_banded" and m.history() == u.accountant.history
    assert np.allclose(m.rdp([2.0, 8.0]), [a / (2 * mu**2) for a in (2.0, 8.0)], rtol=1e-12)
    rep = u.report()["banded"]
    assert rep["participations"] == math.ceil(rounds / period)
    assert rep["sensitivity"] == pytest.approx(_independent_sens(rounds, bands, period), rel=1e-12)


def test_banded_beats_nothing_for_free_the_bands_cost_column_norm():
    """At fixed σ, more bands mean a larger column norm (ε up); b = 1 is independent noise without amplification."""
    eps = []
    for b in (1, 2, 4, 8):
        mu = 3.0 / sensitivity(64, b, 8)
        eps.append(epsilon_of([(mu, 1.0, 1)], 1e-5, "rdp"))
    assert eps == sorted(eps) and eps[0] == pytest.approx(epsilon_of([(3.0, 1.0, 8)], 1e-5, "rdp"), rel=1e-9)


# ---------------------------------------------------------------- (4) the server's release
GRID_CLIP = 0.5


def _agg(gen):
    return SimpleNamespace(theta_sum={"a": torch.randn(3, 4, generator=gen, dtype=torch.float64)},
                           row_sum=torch.randn(5, 2, generator=gen, dtype=torch.float64))  # fmt: skip


@pytest.mark.parametrize("bands", [1, 2, 4, 7])
def test_the_release_is_c_xbar_plus_lattice_noise_and_adds_up_to_noisy_prefix_sums(bands):
    """y = C·w is exactly the lattice-valued C·x̄ + z (z drawn here independently by its label); w − x̄ is the noise
    recursion ẑ = C^{-1}z; the model's running sum is the prefix of x̄ plus A·C^{-1}z."""
    stream, sigma, n = SecretStream(b"b" * 32), 2.0, 9
    bn = BandedNoise(stream, "lbl", bands)
    gen = torch.Generator().manual_seed(bands)
    grid, corrected = release_grid(GRID_CLIP, 22)
    lattice = grid * 2.0 ** -lattice_bits(bands)
    c = [math.comb(2 * j, j) / 4**j for j in range(bands)]
    xs, ws = {"a": [], "rows": []}, {"a": [], "rows": []}
    for r in range(n):
        agg = _agg(gen)
        xs["a"].append(snap(agg.theta_sum["a"], grid).reshape(-1))
        xs["rows"].append(snap(agg.row_sum, grid).reshape(-1))
        bn.release(agg, round_idx=r, clip_norm=GRID_CLIP, noise_multiplier=sigma, noise_rows=True)
        ws["a"].append(agg.theta_sum["a"].reshape(-1).clone())
        ws["rows"].append(agg.row_sum.reshape(-1).clone())
    for name in ("a", "rows"):
        X, W = torch.stack(xs[name]), torch.stack(ws[name])
        Z = torch.stack([grid_noise(X.shape[1], sigma * corrected, lattice, stream, f"lbl r{r} {name}") for r in range(n)])
        Cd = torch.tensor([[c[i - j] if 0 <= i - j < bands else 0.0 for j in range(n)] for i in range(n)], dtype=torch.float64)
        Y = Cd @ W
        assert torch.allclose(Y, Cd @ X + Z, rtol=0, atol=1e-9 * float(Z.abs().max()))
        assert on_grid(Cd @ X + Z, lattice) and on_grid(Cd @ X, lattice)
        zhat = torch.linalg.solve(Cd, Z)
        assert torch.allclose(W - X, zhat, rtol=0, atol=1e-9 * float(Z.abs().max()))
        A = torch.tril(torch.ones(n, n, dtype=torch.float64))
        assert torch.allclose(torch.cumsum(W, 0), A @ X + A @ zhat, rtol=0, atol=1e-8 * float(Z.abs().max()))
        if bands > 1:  # the noise is correlated: not the independent z
            assert not torch.allclose(W - X, Z)
    assert len(bn.rows) == bands  # O(b·d): the last b rounds only


def test_the_recursion_resumes_exactly_from_its_state():
    stream, sigma, bands = SecretStream(b"r" * 32), 1.5, 4
    gen = torch.Generator().manual_seed(3)
    aggs = [_agg(gen) for _ in range(9)]

    def run(bn, rounds):
        out = []
        for r in rounds:
            a = SimpleNamespace(theta_sum={"a": aggs[r].theta_sum["a"].clone()}, row_sum=aggs[r].row_sum.clone())
            bn.release(a, round_idx=r, clip_norm=GRID_CLIP, noise_multiplier=sigma, noise_rows=True)
            out.append((a.theta_sum["a"], a.row_sum))
        return out

    full = run(BandedNoise(stream, "res", bands), range(9))
    first = BandedNoise(stream, "res", bands)
    part = run(first, range(4))
    state = first.state_dict()
    second = BandedNoise(SecretStream.from_state_dict(stream.state_dict()), "res", bands)
    second.load_state_dict(state)
    part += run(second, range(4, 9))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full, part, strict=True))
    lost = BandedNoise(stream, "res", bands)  # the round counter without the rows: not the same release
    lost.load_state_dict({**state, "rows": {}})
    assert not torch.allclose(run(lost, [4])[0][0], full[4][0], rtol=0, atol=1e-3)


def test_an_aborted_round_enters_the_recursion_as_zero():
    stream, bands = SecretStream(b"z" * 32), 3
    gen = torch.Generator().manual_seed(5)
    a0, a2 = _agg(gen), _agg(gen)
    zero = SimpleNamespace(
        theta_sum={"a": torch.zeros(3, 4, dtype=torch.float64)}, row_sum=torch.zeros(5, 2, dtype=torch.float64)
    )
    skip, dense = BandedNoise(stream, "ab", bands), BandedNoise(stream, "ab", bands)
    for bn, rounds in ((skip, [(0, a0), (2, a2)]), (dense, [(0, a0), (1, zero), (2, a2)])):
        for r, a in rounds:
            a = SimpleNamespace(theta_sum={"a": a.theta_sum["a"].clone()}, row_sum=a.row_sum.clone())
            bn.release(a, round_idx=r, clip_norm=GRID_CLIP, noise_multiplier=1.0, noise_rows=True)
            last = a
        bn.last = last
    assert torch.equal(skip.last.theta_sum["a"], dense.last.theta_sum["a"])


# ---------------------------------------------------------------- (5) end to end, resume
BANDED = [
    'protocols=["dp"]',
    'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "mechanism": "banded", "bands": 2}',
    "training.sampling=cyclic",
    "training.client_fraction=0.5",
    "privacy.noise_seed=7",
]


def test_a_banded_run_reports_its_epsilon_and_resumes_exactly(tmp_path):
    ov = [*BANDED, "training.rounds=6", "output.checkpoint_every=3"]
    full = Experiment(small_plan(*ov), run_dir=tmp_path / "full").run(progress=False).summary
    c = full["privacy"]["units"]["client"]
    mu = 2.0 / _independent_sens(6, 2, 2)
    assert c["steps"] == 6 and c["sample_rate"] == 1.0 and c["banded"]["participations"] == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert c["epsilon"] == pytest.approx(epsilon_of([(mu, 1.0, 1)], 1e-5, "rdp"), rel=1e-12)
    Experiment(small_plan(*ov, "training.rounds=3"), run_dir=tmp_path / "part").run(progress=False)
    secrets = torch.load(tmp_path / "part" / "private" / "checkpoints" / "server_secrets.pt", weights_only=False)
    assert secrets["protocols"]["dp"]["banded"]["next_round"] == 3  # the private recursion state, with the key
    e = Experiment(small_plan(*ov), run_dir=tmp_path / "part")
    assert e.resume()
    (dp,) = [la for la in e.stack.layers if la.name == "dp"]  # the recursion's private state, as checkpointed
    saved = secrets["protocols"]["dp"]["banded"]["rows"]
    assert dp.banded_noise.next_round == 3 and dp.banded_noise.stream is dp.server_stream
    assert dp.banded_noise.rows.keys() == saved.keys() == {1, 2}
    assert all(torch.equal(dp.banded_noise.rows[r][n][i], saved[r][n][i]) for r in saved for n in saved[r] for i in (0, 1))
    resumed = e.run(progress=False).summary
    assert resumed["privacy"]["units"]["client"]["epsilon"] == c["epsilon"]
    assert resumed["final"] == full["final"]
    a = torch.load(tmp_path / "full" / "private" / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "part" / "private" / "checkpoints" / "last.pt", weights_only=False)
    assert all(torch.equal(a["theta"][n], b["theta"][n]) for n in a["theta"])


def test_the_server_noise_reaches_the_released_model(tmp_path):
    """The banded noise is the run's client-level noise: the schedule is public and training deterministic given the
    seed, so two runs that differ only in the noise key differ only by it (by about σ·C/(N/P) a coordinate)."""
    ov = [x for x in BANDED if not x.startswith("privacy.noise_seed")] + ["training.rounds=2"]
    runs = [Experiment(small_plan(*ov, f"privacy.noise_seed={k}"), run_dir=tmp_path / str(k)).run(progress=False)
            for k in (1, 2)]  # fmt: skip
    thetas = [torch.load(tmp_path / str(k) / "private" / "checkpoints" / "last.pt", weights_only=False)["theta"] for k in (1, 2)]
    diff = max(float((thetas[0][n] - thetas[1][n]).abs().max()) for n in thetas[0])
    assert diff > 1e-3, diff
    assert all(r.summary["privacy"]["units"]["client"]["steps"] == 2 for r in runs)


def test_validate_plans_the_banded_epsilon(tmp_path):
    ov = [x for o in (*BANDED, "training.rounds=8") for x in ("--set", o)]
    code, out, err = cli("validate", *_default(tmp_path), *ov)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("dp client unit")]
    mu = 2.0 / _independent_sens(8, 2, 2)
    assert f"plans ε = {epsilon_of([(mu, 1.0, 1)], 1e-5, 'rdp'):.4g}" in line and "2 bands, cyclic period 2" in line


# ---------------------------------------------------------------- (6) bad inputs
@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["training.sampling=poisson"], "with training.sampling: poisson"),
        (["training.client_fraction=1.0", "training.sampling=cyclic"], "2 bands with a cyclic participation period of 1"),
        (['privacy.client={"noise_multiplier": 1.0, "mechanism": "banded", "bands": 3}'], "3 bands with a cyclic"),
        (['privacy.client={"noise_multiplier": 1.0, "mechanism": "banded", "bands": 2, "noise": "clients"}'], "noise: clients"),
        (['privacy.client={"noise_multiplier": 1.0, "mechanism": "banded"}'], "needs privacy.client.bands"),
        (['privacy.client={"noise_multiplier": 1.0, "bands": 2}'], "needs privacy.client.bands"),
        (["training.client_fraction=0.3"], "client_fraction = 1/P"),
        (["training.client_fraction=1.0", "training.clients_per_round=3"], "not clients_per_round"),
        (['privacy.client={"noise_multiplier": 1.0}'], "needs training.sampling: poisson"),
    ],
    ids=[
        "poisson",
        "full-participation",
        "bands-above-period",
        "client-noise",
        "no-bands",
        "bands-without-banded",
        "fraction-not-1/P",
        "cyclic-fixed-cohort",
        "gaussian-with-cyclic",
    ],  # fmt: skip
)
def test_bad_banded_configs_are_one_error_line(tmp_path, extra, needle):
    ov = [x for o in (*BANDED, "training.rounds=1", *extra) for x in ("--set", o)]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], needle)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], needle)
    assert not out.exists()


# ---------------------------------------------------------------- (7) the worst-case check of issue 52
@pytest.mark.parametrize(
    "combo",
    [("fedalc", "on", "off", "banded", "trained", "none"), ("fedavg_general", "off", "off", "banded", "trained", "none")],
    ids=["fedalc-w_step", "fedavg"],
)
def test_banded_combinations_pass_the_worst_case_check(combo, tmp_path):
    """A neighbouring pair for one round (tests/protocols/worst_case_check.py): the reported ε at least the realised
    PLD, at most and not below the independent composition, no release moved beyond its sensitivity."""
    from tests.protocols.worst_case_check import check
    from tests.protocols.worst_case_combinations import Combination

    v = check(Combination(*combo), tmp_path)
    assert not v.failures, (v.failures, v.figures)
    assert any(m["kind"] == "client_banded" for m in v.figures["mechanisms"]), v.figures
