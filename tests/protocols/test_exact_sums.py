"""Sums before the grid snap (:mod:`protocols.dp.exact_sums`): the worst-case summation error against the accounted
sensitivity. Exact arithmetic is Python's :class:`fractions.Fraction` (every float is a dyadic rational)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from protocols.dp.accountant import noise_grid
from protocols.dp.discrete_gaussian import release_grid
from protocols.dp.exact_sums import (
    CLIP_MARGIN,
    MAX_FLOAT_BATCH,
    check_float_batch,
    clip_factors,
    float64_sum_error,
    float64_sum_slack,
    gamma_n,
    per_sample_norms64,
)
from protocols.dp.label_set_dpsgd import dp_label_set_step
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.randomness import SecretStream


def adversarial_terms(n: int, clip: float, dtype) -> list:
    """``n`` values in (0, C] whose running sum in ``dtype`` (round to nearest) rounds down by almost half an ulp at
    every addition: the worst case of recursive summation, an error ≈ u·Σ_k k·C ≈ u·n²·C/2."""
    one = dtype(clip)
    terms, s = [one], Fraction(float(one))
    for _ in range(n - 1):
        u = Fraction(float(np.spacing(dtype(float(s + Fraction(float(one)))))))
        m = math.floor((s + Fraction(float(one))) / u) - 1
        x = (m + Fraction(1, 2)) * u - s - Fraction(float(np.spacing(one)))  # just below a midpoint: rounds down
        xf = dtype(float(x))
        assert Fraction(float(xf)) == x and 0 < xf <= one
        terms.append(xf)
        s = Fraction(float(dtype(float(s + x))))  # the computed running sum
    return terms


def running_sum_error(terms: list, dtype) -> Fraction:
    """|fl(Σ) − Σ| of the running (left-to-right) sum in ``dtype``, the order in which a trainer adds chunk sums."""
    acc = dtype(0.0)
    for t in terms:
        acc = dtype(acc + t)
    return abs(Fraction(float(acc)) - sum(Fraction(float(t)) for t in terms))


def test_a_float32_running_sum_can_exceed_the_grid_margin_many_times():
    """The finding (issue 52, 4): a float32 sum of 1,000 unit-norm contributions is off by up to ~u·n²/2, about 30
    times the grid's whole margin γ√d (here d = 1, γ = 2^-10): nothing in Δ + γ√d covers that."""
    n, C = 1000, 1.0
    err = running_sum_error(adversarial_terms(n, C, np.float32), np.float32)
    margin = noise_grid(C, 1) * 1.0
    assert err > 20 * margin
    assert err <= gamma_n(n, 2.0**-24) * n * C  # and Higham's bound holds for it
    assert err > 1e6 * float64_sum_error(n, C)  # float32 accumulation is far outside the float64 bound Δ carries


@pytest.mark.parametrize("n", [2, 1000, 20_000])
def test_a_float64_sum_of_worst_case_terms_stays_inside_the_accounted_error(n):
    """The same construction in float64, summed as the trainer sums (a running sum), by torch's reduction and by the
    fast path's matrix product: every realised error ≤ γ_{n+1}·n·C (:func:`float64_sum_error`), which is what the
    noise adds to C (twice: :func:`float64_sum_slack`); the adversarial order gets within a factor ~4 of it."""
    C = 1.0
    terms = adversarial_terms(n, C, np.float64)
    exact = sum(Fraction(t) for t in terms)
    bound = Fraction(float64_sum_error(n, C))
    running = running_sum_error(terms, np.float64)
    assert running <= bound
    if n >= 1000:
        assert running >= bound / 8  # the construction is adversarial: the bound is nearly reached
    v = torch.tensor(terms, dtype=torch.float64)
    for got in (v.sum(), (v[:, None].T @ torch.ones(n, 1, dtype=torch.float64))[0, 0]):
        assert abs(Fraction(float(got)) - exact) <= bound


def test_the_slack_covers_two_sums_at_the_public_cap_and_larger_batches_are_refused():
    C = 3.0
    assert float64_sum_slack(C) == pytest.approx(2 * gamma_n(MAX_FLOAT_BATCH + 1) * MAX_FLOAT_BATCH * C, rel=1e-15)
    assert float64_sum_slack(C) <= 2.0**-19 * C  # ≈ 2^-20·C: negligible beside the grid's 2^-10
    check_float_batch(MAX_FLOAT_BATCH)
    with pytest.raises(ValueError, match="exceeds 65536"):
        check_float_batch(MAX_FLOAT_BATCH + 1)


def test_the_clip_holds_for_the_computed_vector():
    """f·g as computed (float64 product of a float32 gradient and the float64 factor) has norm ≤ C, exactly."""
    torch.manual_seed(0)
    g = torch.randn(64, 5000) * torch.logspace(-3, 3, 64)[:, None]
    C = 0.7
    f = clip_factors(per_sample_norms64([g]), C)
    c = g.double() * f[:, None]
    for i in range(64):
        assert sum(Fraction(float(x)) ** 2 for x in c[i]) <= Fraction(C) ** 2
    assert float(f.min()) < 1 and float(f[f < 1].max()) == pytest.approx(1.0, abs=1) and CLIP_MARGIN == 2.0**-20


def _worst_grads(n: int, d: int, C: float, seed: int = 0) -> torch.Tensor:
    """Per-sample gradients at or above the clip norm, all in one direction with float32 low bits set (a float32 sum
    of them loses bits at every addition)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.rand(d, generator=gen) + 0.5
    g = base * (1.0 + torch.rand(n, d, generator=gen) * 1e-3)
    return (g / g.norm(dim=1, keepdim=True) * C * 1.5).float()


def test_dp_sgd_clip_sum_is_exact_on_the_grid_and_a_neighbour_moves_it_by_at_most_c_plus_half_a_grid():
    """The per-sample path (LocalDPSGD.clip_sum): the sum equals γ·Σ_i round(f_i g_i/γ) exactly (Python integers),
    and adding one sample changes it by ≤ C + γ√d/2 ≤ the accounted C + γ√d (computed exactly)."""
    n, d, C = 300, 40, 1.0
    g = _worst_grads(n + 1, d, C)
    priv = LocalDPSGD(clip_norm=C, noise_multiplier=1.0, sample_rate=1.0, divisor=1.0, stream=SecretStream.fresh(),
                      label="x")  # fmt: skip
    grid = release_grid(C, d)[0]
    f = clip_factors(per_sample_norms64([g]), C)
    idx = [[int(v) for v in torch.round(g[i].double() * f[i] / grid)] for i in range(n + 1)]
    want = [sum(idx[i][j] for i in range(n)) for j in range(d)]
    got = priv.clip_sum({"w": g[:n]})["w"]
    assert got.dtype == torch.float64
    assert [Fraction(float(v)) / Fraction(grid) for v in got] == want  # exact, not within a tolerance
    more = priv.clip_sum({"w": g})["w"]
    diff_sq = sum((Fraction(float(a)) - Fraction(float(b))) ** 2 for a, b in zip(more, got, strict=True))
    assert diff_sq <= (Fraction(C) + Fraction(grid) * Fraction(math.sqrt(d)) / 2) ** 2
    _, corrected = release_grid(C, d)
    assert C + grid * math.sqrt(d) / 2 <= corrected
    # a float32 sum of the same clipped contributions (the old path) is not on the grid and not exact
    old = torch.einsum("b,bd->d", f[:n].float(), g[:n])
    assert [Fraction(float(v)) / Fraction(grid) for v in old.double()] != want


def test_dp_sgd_noise_std_includes_the_float64_bound(monkeypatch):
    """σ·(C + γ√d + slack) is the std the sampler gets: the released sum's sensitivity with the fast path's float64
    error bound, so σ stays the noise multiplier of the worst case (the mutant without the slack fails here)."""
    import protocols.dp.local_dpsgd as mod

    seen = []
    real = mod.grid_noise

    def spy(n, std, grid, stream, label):
        seen.append((n, std, grid))
        return real(n, std, grid, stream, label)

    monkeypatch.setattr(mod, "grid_noise", spy)
    sigma, C, d = 1.3, 2.0, 500
    priv = LocalDPSGD(clip_norm=C, noise_multiplier=sigma, sample_rate=1.0, divisor=1.0, stream=SecretStream.fresh(),
                      label="x")  # fmt: skip
    priv.finish({"w": torch.zeros(d, dtype=torch.float64)}, "s0")
    grid = noise_grid(C, d)
    ((_, std, got_grid),) = seen
    assert got_grid == grid
    assert std == pytest.approx(sigma * (C + grid * math.sqrt(d) + float64_sum_slack(C)), rel=1e-15)
    assert std > sigma * (C + grid * math.sqrt(d))


def test_the_fast_path_sums_in_float64(monkeypatch):
    """The ghost-norm fast path returns float64 sums (the bound above is float64's; float32 would void it)."""
    from secure_fed.algorithms.losses import positive_hinge_loss
    from secure_fed.algorithms.per_sample import clipped_sum_linear
    from secure_fed.models.encoders import SparseTextEncoder
    from secure_fed.models.families import CosineEmbedding

    torch.manual_seed(0)
    enc = SparseTextEncoder(20, embed_dim=8, hidden_dims=(7,), out_dim=6)
    rows = torch.randn(2, 6).requires_grad_(True)
    x, y = torch.rand(9, 20), torch.rand(9, 2) < 0.7
    priv = LocalDPSGD(clip_norm=0.05, noise_multiplier=1.0, sample_rate=1.0, divisor=1.0, stream=SecretStream.fresh(),
                      label="x")  # fmt: skip
    sums, _ = clipped_sum_linear(family=CosineEmbedding(), model=enc, rows=rows, x=x, targets=y,
                                 loss_fn=positive_hinge_loss, factors=priv.factors)  # fmt: skip
    assert sums and all(s.dtype == torch.float64 for s in sums.values())


def test_the_w_step_sum_is_exact_on_its_release_grid():
    """The server's W step: the clipped per-set gradients' sum that reaches the noise is exactly γ·Σ round(f_i G_i/γ)
    on the grid of its release (Δ = 2C: a merged set's replacement moves it by ≤ 2C + γ√d, the accounted value)."""
    n, C_rows, d, clip = 50, 4, 6, 1.0
    G = _worst_grads(n, C_rows * d, clip, seed=3).reshape(n, C_rows, d)
    W = torch.nn.functional.normalize(torch.randn(C_rows, d), dim=-1)
    seen = {}

    def noise(total, sigma, sens):
        seen["total"], seen["sens"] = total.clone(), sens
        return total

    def per_set_grads(_W):
        return lambda Yb: G[Yb[:, 0].long()]

    sets = torch.arange(n)[:, None].repeat(1, C_rows).float()  # row i selects G[i]
    dp_label_set_step(W, sets, per_set_grads, clip_norm=clip, noise_multiplier=2.0, divisor=10.0, step_size=0.1,
                      pick=torch.ones(n, dtype=torch.bool), noise=noise, chunk=7)  # fmt: skip
    grid = release_grid(seen["sens"], W.numel())[0]
    f = clip_factors(per_sample_norms64([G]), clip)
    want = np.zeros(W.numel(), dtype=object)
    for i in range(n):
        want += np.array([int(v) for v in torch.round(G[i].double().flatten() * f[i] / grid)], dtype=object)
    got = [Fraction(float(v)) / Fraction(grid) for v in seen["total"].flatten()]
    assert seen["total"].dtype == torch.float64 and got == list(want)
