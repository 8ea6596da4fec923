"""Discrete Gaussian noise on a public grid: every DP draw of secure-fed (server and client-level noise, each client's
noise share, the server's W step, DP-SGD in client training).

**Why.** Floating-point Gaussian noise (Box–Muller in float64, or float32 with a 24-bit angle) is open to Mironov's
precision attacks (CCS 2012): the set of floats that x + noise can take, and their probabilities, depend on x, so
the low bits of a release can tell neighbouring inputs apart whatever σ is. Here the released value is
γ·(round(x/γ) + Z) with Z an *integer* drawn from the discrete Gaussian N_Z(0, (std/γ)²) and γ a power of two
(:func:`protocols.dp.accountant.noise_grid`): it lies exactly on the grid γ·ℤ for every input (tested), the grid
and the rounding are public functions of the sum, and Z is drawn independently of the data. Everything the caller
does afterwards (a division by a public divisor, a cast to float32 or bf16, an optimiser step) is post-processing of
that on-grid value.

**The sampler** is Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020),
Algorithm 3 over their Algorithm 2 (discrete Laplace), run on the party's :class:`~protocols.randomness.SecretStream`
(one AES-256-CTR key stream per draw, keyed by HKDF(key, label) and read in order; a resumed run redraws the same
values), vectorised in numpy: with t = ⌊σ⌋ + 1, repeat until accepted:

1. discrete Laplace of scale t: U uniform on {0, …, t−1} (exact: Lemire's multiply-shift with rejection on 32-bit
   uniforms, or a 64-bit word mod t with rejection for t ≥ 2^32); V ~ Geometric(1 − e^{−1}); X = U + t·V; keep it
   with probability e^{−U/t}, and X = 0 only with probability 1/2 (the Algorithm's rejected (−, 0));
2. keep X with probability exp(−(X − σ²/t)² / (2σ²)); then a uniform sign.

The two keep trials are independent of each other and of V, so one trial Bern(e^{−(U/t + (X − σ²/t)²/(2σ²))}) draws
both, and the sign, independent of everything else, is drawn for the kept ones only. Each block of 2^14 outputs
draws about 2.2 times as many candidates at once, and each loop (the geometric's rare continuation, the Bernoulli
chains) runs over the shrinking set of candidates still in it: no Python loop over elements. The outputs are int64.

**The float step, and why it does not reach the released value.** Two kinds of step compare a random integer with
a threshold computed in floating point: V from one 64-bit word w by the thresholds ⌊e^{−k}·2^64⌋, k = 1..4 (and a fresh
word, memoryless, past 4), and the trial Bern(e^{−a}) for a ∈ [0, 4]: a 53-bit integer j < e^{−a}·2^53 (success
probability ⌈e^{−a}·2^53⌉·2^-53). A trial Bern(e^{−x}) with x > 4 is the product of ⌈x/4⌉ independent trials with
exponents a_i ≤ 4, Σa_i = x (exact float subtractions), so every trial compares against a probability of at least
e^{−4}: its error is relative, at most e^4·2^-53 + 2^-52 ≈ 6·10^-15 plus the rounding of its exponent, never a
truncated or floored tail. Consequences:

* the output is an integer, so it carries no float artefacts: its support is all of ℤ whatever σ, and the release
  γ·(round(x/γ) + Z) is exact in float64 (γ a power of two, |round(x/γ) + Z| < 2^52, checked);
* the law P̃ the sampler draws differs from the exact N_Z(0, σ²) only by a *data-independent*, multiplicative
  factor: |log P̃(y)/P(y)| ≤ η(y) ≈ 2·(⌈a(y)/4⌉·6·10^-15 + a(y)·5·10^-16 + (1 + V/4)·2^-52), a(y) the trial's
  exponent (≈ x(y) = (|y| − σ²/t)²/(2σ²), plus at most 1), the factor 2 for the normalisation: about 2·10^-14 at 3σ
  and 2·10^-13 at 10σ. The privacy loss of one released coordinate then differs from the exact discrete Gaussian's
  by at most η(y) + η(y − Δ_i); over N released coordinates that is at most about 4·10^-13·N on ε outside the event
  |Z| > 10σ (mass < 10^-22 per coordinate, added to δ). This is a worst-case bound (every coordinate's float errors
  aligned): for Bibtex's W step (81,408 coordinates, 100 steps) 3·10^-6 on ε; for a 3.45M-coordinate DP-SGD sum
  1.4·10^-6 on ε per step. It is not added to the reported ε.

**Accounting.** The sum is rounded to the grid before the noise (deterministic, ties to even), which raises its L2
sensitivity from Δ to Δ + γ√d (:func:`protocols.dp.accountant.grid_sensitivity`); the noise std is σ·(Δ + γ√d)
(:func:`~protocols.dp.accountant.grid_corrected_std`), so the ledger's σ is the noise multiplier of the rounded
mechanism, and γ is chosen so that the factor is at most 1 + 2^-10. The discrete Gaussian N_Z(0, σ²) with integer
L2 sensitivity Δ has Rényi divergence at most αΔ²/(2σ²) at every order α — the continuous Gaussian's (CKS 2020,
Thm 4 in one dimension, Thm 15 for the multivariate product) — so it is ½(Δ/σ)²-zCDP and the Gaussian RDP curve is
an upper bound for a full-batch step. For the Poisson-subsampled steps the RDP ledger uses the subsampled Gaussian's
RDP at the same σ, which :mod:`protocols.dp.discrete_gaussian_accounting` proves for the discrete Gaussian (exact at
integer orders; the fractional ones interpolated); the PRV accountant is the continuous Gaussian's privacy-loss
distribution, the standard assumption of the distributed-discrete-Gaussian literature (Kairouz, Liu & Steinke 2021),
not proven for the discrete one. At the grid steps used (std/γ ≥ 10^5) the two laws agree to within
10^-40 on every integer's relative probability, by Poisson summation.

**Noise shares** (``privacy.client.noise: clients``): each client adds γ·Z_i, Z_i ~ N_Z(0, s²), s the share's std in
grid units, inside secure aggregation, whose fixed-point encoding (2^-frac_bits ≤ γ) carries them exactly. The sum of
n such shares is not exactly a discrete Gaussian; Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian
Mechanism for Federated Learning with Secure Aggregation" (ICML 2021, Thm 1/Prop. 14) bound it: for integer shifts Δ,
D_α(ΣZ + Δ ‖ ΣZ) ≤ α‖Δ‖²/(2ns²) + τ·d with τ = 10·Σ_{k=1}^{n−1} e^{−2π²s²·k/(k+1)} (:func:`distributed_tau`). From
s = 6 on τ < 10^-150·n: the correction is below double precision and the ledger's continuous bound is the one used.
On the sensitivity's own grid s ≈ σ·2^10·√(d/t), far above 6 at any σ worth accounting; a client refuses to send
an update whose share is below 6 steps (``client_dp.MIN_SHARE_GRID_STEPS``: a σ near 0, or a very coarse
``frac_bits``), since τ·d is not in the ledger's curve.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from protocols.dp.accountant import grid_sensitivity, noise_grid
from protocols.randomness import SecretStream

_TWO53 = float(2**53)
#: outputs drawn per block (about 2.2 times as many candidates: a few arrays of them stay in the L2 cache)
CHUNK = 1 << 14
#: the largest |k| of a grid value γ·k that float64 holds exactly (and with room for k + Z)
MAX_GRID_INDEX = 2**52


class _Words:
    """The words of one draw: a single AES-CTR key stream keyed by HKDF(key, label), read in order
    (:meth:`SecretStream.word_reader`); the draw's consumption of it is a deterministic function of the key and the
    label (a resumed run redraws the same)."""

    def __init__(self, stream: SecretStream, label: str):
        self._read = stream.word_reader(label)

    def __call__(self, n: int) -> np.ndarray:
        return self._read(n)


def _j53(w: np.ndarray) -> np.ndarray:
    """The top 53 bits of 64-bit words as float64 integers j ∈ [0, 2^53) (exact; via int64, which numpy converts
    much faster than uint64)."""
    return (w >> np.uint64(11)).view(np.int64).astype(np.float64)


#: the largest exponent of one Bernoulli trial: e^{−a} ≥ e^{−4}, so the 53-bit comparison's absolute error 2^-53 is
#: a relative error ≤ e^4·2^-53 ≈ 6·10^-15
TRIAL_EXPONENT = 4.0


def _bernoulli_exp_small(words: _Words, a: np.ndarray) -> np.ndarray:
    """Bern(e^{−a}) for each a ∈ [0, 4]: a 53-bit integer j < e^{−a}·2^53 (probability ⌈e^{−a}·2^53⌉·2^-53)."""
    return _j53(words(len(a))) < np.exp(-a) * _TWO53


def bernoulli_exp(words: _Words, x: np.ndarray) -> np.ndarray:
    """Bern(e^{−x}) for each x ≥ 0 (∞: never), as the product of ⌈x/4⌉ trials Bern(e^{−a}) with a ≤ 4 (each
    trial's error is relative, see the module docstring); a loop over the shrinking set of elements still tested."""
    rem = np.asarray(x, dtype=np.float64)
    a = np.minimum(rem, TRIAL_EXPONENT)
    out = _bernoulli_exp_small(words, a)
    rem = rem - a
    active = np.flatnonzero(out & (rem > 0.0))
    while active.size:
        a = np.minimum(rem[active], TRIAL_EXPONENT)
        ok = _bernoulli_exp_small(words, a)
        out[active[~ok]] = False
        rem[active] -= a
        active = active[ok & (rem[active] > 0.0)]
    return out


def _uniform_below(words: _Words, n: int, t: int) -> np.ndarray:
    """``n`` integers uniform on {0, …, t−1}, exactly. For t < 2^32, Lemire's multiply-shift on the top 32 bits x
    of the words (x·t >> 32, rejecting x when (x·t mod 2^32) < 2^32 mod t); else a 64-bit word mod t, rejecting words
    at or above the largest multiple of t below 2^64."""
    if t < 2**32:
        threshold = np.uint64((2**32 - t) % t)

        def draw(k: int) -> np.ndarray:  # the top 32 bits of a word each
            return (words(k) >> np.uint64(32)) * np.uint64(t)

        m = draw(n)
        bad = np.flatnonzero((m & np.uint64(0xFFFFFFFF)) < threshold)
        while bad.size:
            m[bad] = draw(bad.size)
            bad = bad[(m[bad] & np.uint64(0xFFFFFFFF)) < threshold]
        return (m >> np.uint64(32)).view(np.int64)
    limit = (2**64 // t) * t
    w = words(n)
    if limit < 2**64:
        bad = np.flatnonzero(w >= np.uint64(limit))
        while bad.size:
            w[bad] = words(bad.size)
            bad = bad[w[bad] >= np.uint64(limit)]
    return (w % np.uint64(t)).view(np.int64)


#: Geometric(1 − e^{−1}) from one word w: V ≥ k (k = 1..4) when w < ⌊e^{−k}·2^64⌋; at V = 4 it goes on with a fresh word
_GEOMETRIC_STEPS = 4
_GEOMETRIC_THRESHOLDS = [np.uint64(math.floor(math.exp(-k) * 2.0**64)) for k in range(1, _GEOMETRIC_STEPS + 1)]


def _geometric_e1(words: _Words, n: int) -> np.ndarray:
    """``n`` draws of V ~ Geometric(1 − e^{−1}) on {0, 1, …} (P(V ≥ k) = e^{−k}): up to 4 from one 64-bit word w by
    the thresholds ⌊e^{−k}·2^64⌋ (P(V ≥ k) then within a relative 2^-52 of e^{−k}, k ≤ 4), and, memoryless, 4 more
    from a fresh word for the ≈1.8% that reach 4, and so on."""
    w = words(n)
    v = (w < _GEOMETRIC_THRESHOLDS[0]).view(np.int8)
    for thr in _GEOMETRIC_THRESHOLDS[1:]:
        v = v + (w < thr).view(np.int8)
    v = v.astype(np.int64)
    more = np.flatnonzero(v == _GEOMETRIC_STEPS)
    if more.size:
        v[more] += _geometric_e1(words, more.size)
    return v


def _laplace_magnitudes(words: _Words, n: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` candidates (x, a) of the discrete Laplace's magnitude (CKS 2020, Algorithm 2): X = U + t·V, to be kept
    with probability e^{−a}, a = U/t, and for X = 0 only with probability 1/2 more (a = ∞ when a coin says so: the
    Algorithm's rejected (−, 0)). The keep trial is the caller's, which merges it with its own (the trials are
    independent of each other and of V, so one trial Bern(e^{−(a + x)}) draws both); the sign, independent of the
    rest, is drawn for the kept candidates only (:func:`_signed`)."""
    u = _uniform_below(words, n, t)
    x = u + t * _geometric_e1(words, n)
    a = u / t
    zeros = np.flatnonzero(x == 0)
    if zeros.size:
        a[zeros[(words(zeros.size) & np.uint64(1)).astype(bool)]] = np.inf
    return x, a


def _signed(words: _Words, x: np.ndarray) -> np.ndarray:
    """``x`` with an independent uniform sign each (the lowest bit of a fresh word)."""
    negative = (words(x.size) & np.uint64(1)).astype(bool)
    return np.where(negative, -x, x)


def discrete_laplace(words: _Words, n: int, t: int) -> np.ndarray:
    """Up to ``n`` draws of the discrete Laplace P(y) ∝ e^{−|y|/t} (CKS 2020, Algorithm 2); the rejected
    candidates are dropped, so about 0.63·n come back (for large t)."""
    x, a = _laplace_magnitudes(words, n, t)
    return _signed(words, x[bernoulli_exp(words, a)])


def sample_discrete_gaussian(stream: SecretStream, n: int, sigma: float, label: str) -> np.ndarray:
    """``n`` int64 draws of N_Z(0, σ²), P(y) ∝ exp(−y²/(2σ²)) on ℤ (CKS 2020, Algorithm 3), from ``stream``'s
    words for ``label``: the same key and label give the same draws; another label independent ones."""
    if not (sigma >= 0.0 and math.isfinite(sigma)):
        raise ValueError(f"discrete Gaussian: σ must be finite and ≥ 0, not {sigma}")
    out = np.zeros(n, dtype=np.int64)
    if sigma == 0.0 or n == 0:
        return out
    t = math.floor(sigma) + 1
    tau, two_var = sigma * sigma / t, 2.0 * sigma * sigma
    words = _Words(stream, f"discrete gaussian {label}")
    for start in range(0, n, CHUNK):  # cache-sized blocks: each pass over the candidates stays in the L2 cache
        stop, filled = min(n, start + CHUNK), start
        while filled < stop:
            need = stop - filled
            x, a = _laplace_magnitudes(words, int(need * 2.2) + 64, t)
            a += (x - tau) ** 2 / two_var  # Laplace's keep trial and the Gaussian's (on |Y| = X), as one (see above)
            x = x[bernoulli_exp(words, a)][:need]
            out[filled : filled + x.size] = _signed(words, x)
            filled += x.size
    return out


def snap(total: torch.Tensor, grid: float) -> torch.Tensor:
    """``total`` rounded to the nearest multiple of ``grid`` (ties to even), in float64 on its device: a public,
    deterministic function of the sum (its sensitivity grows by at most γ√d, accounted by the noise)."""
    _check_grid(grid)
    k = torch.round(total.double() / grid)
    _check_index(k)
    return k * grid


def grid_noise(n: int, std: float, grid: float, stream: SecretStream, label: str) -> torch.Tensor:
    """γ·Z, Z ~ N_Z(0, (std/γ)²): ``n`` float64 values on the grid γ·ℤ (CPU)."""
    _check_grid(grid)
    z = sample_discrete_gaussian(stream, n, float(std) / grid, label)
    return torch.from_numpy(z.astype(np.float64)) * grid


def snap_and_noise(total: torch.Tensor, std: float, grid: float, stream: SecretStream, label: str) -> torch.Tensor:
    """The released value γ·(round(total/γ) + Z), Z ~ N_Z(0, (std/γ)²) per coordinate: float64, on ``total``'s
    device and shape, exactly on the grid γ·ℤ. ``std`` is the noise std in the sum's units (σ times the grid-corrected
    sensitivity, :func:`protocols.dp.accountant.grid_corrected_std`); ``stream`` the drawing party's secret."""
    s = snap(total, grid)
    if std <= 0.0:
        return s
    out = s.add_(grid_noise(s.numel(), std, grid, stream, label).reshape(s.shape).to(s.device))
    _check_index(out / grid)
    return out


def on_grid(x: torch.Tensor, grid: float) -> bool:
    """Every value of ``x`` an exact multiple of ``grid`` (the released values' invariant; for tests and audits)."""
    k = x.double() / grid
    return bool(torch.equal(k, torch.round(k)))


def distributed_tau(sigma: float, n: int) -> float:
    """Kairouz–Liu–Steinke 2021's τ = 10·Σ_{k=1}^{n−1} exp(−2π²σ²·k/(k+1)) for a sum of ``n`` discrete Gaussian
    shares N_Z(0, σ²) (σ in grid units): the sum's Rényi divergence exceeds the discrete Gaussian N_Z(0, nσ²)'s bound
    by at most τ·d (d coordinates). 0.0 when it underflows (σ ≳ 6)."""
    return 10.0 * sum(math.exp(-2.0 * math.pi**2 * sigma**2 * k / (k + 1)) for k in range(1, max(int(n), 1)))


def _check_grid(grid: float) -> None:
    if not (grid > 0.0 and math.frexp(grid)[0] == 0.5):
        raise ValueError(f"the noise grid must be a power of two (exact in floating point), not {grid}")


def _check_index(k: torch.Tensor) -> None:
    if k.numel() and bool((k.abs() >= MAX_GRID_INDEX).any()):
        raise ValueError("a value exceeds 2^52 grid steps: the grid is too fine for float64 to hold it exactly")


def release_grid(sensitivity: float, dim: int, finest_grid: float | None = None, *, slack: float = 0.0) -> tuple[float, float]:
    """(γ, the noise std per unit σ) of a released sum of ``dim`` coordinates with L2 sensitivity ``sensitivity``:
    γ = :func:`~protocols.dp.accountant.noise_grid` (at least ``finest_grid``), and Δ + γ√d (+ ``slack``), the
    sensitivity of the rounded sum, which σ multiplies (:func:`~protocols.dp.accountant.grid_corrected_std`).
    ``slack`` is what the sum's own formation adds to Δ in the worst case (a float64 sum's proven error bound,
    :func:`protocols.dp.exact_sums.float64_sum_slack`; 0 for an exact sum); the grid is chosen without it."""
    if not (slack >= 0.0 and math.isfinite(slack)):
        raise ValueError(f"release_grid: slack {slack} must be finite and ≥ 0")
    grid = noise_grid(sensitivity, dim, coarsest_below=finest_grid)
    return grid, grid_sensitivity(sensitivity, grid, dim) + float(slack)


def noisy_sum(total: torch.Tensor, *, sigma: float, sensitivity: float, stream: SecretStream, label: str) -> torch.Tensor:
    """The Gaussian mechanism's release of the clipped sum ``total`` (all its coordinates, L2 sensitivity
    ``sensitivity``, noise multiplier ``sigma``): :func:`snap_and_noise` on the grid :func:`release_grid` picks, with
    std σ·(Δ + γ√d). Float64 on ``total``'s device, every value on the grid. σ = 0 (no mechanism, ε = ∞) returns
    ``total`` as it is."""
    if sigma == 0.0:
        return total
    grid, corrected = release_grid(sensitivity, total.numel())
    return snap_and_noise(total, float(sigma) * corrected, grid, stream, label)


__all__ = [
    "bernoulli_exp", "discrete_laplace", "distributed_tau", "grid_noise", "noisy_sum", "on_grid", "release_grid",
    "sample_discrete_gaussian", "snap", "snap_and_noise",
]  # fmt: skip
