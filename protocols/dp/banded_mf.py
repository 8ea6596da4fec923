"""Banded matrix factorisation for the prefix-sum workload (DP-FTRL with correlated noise), torch-free: the strategy
matrix C, its inverse applied as a recursion, and its sensitivity under cyclic participation.

**The factorisation.** The server's model after round t is θ_0 + η·(prefix sum of the rounds' clipped sums)/(a public
divisor): the workload is A, the n×n lower-triangular all-ones matrix. A matrix mechanism factors A = B·C, releases
C·x + z (z Gaussian) and post-processes it with B: B(Cx + z) = Ax + A·C^{-1}z, i.e. round t's increment is
x_t + ẑ_t with ẑ = C^{-1}z — correlated noise that the prefix sums partly cancel.

C here is the lower-triangular Toeplitz matrix of the coefficients c_k = binom(2k, k)/4^k (1, 1/2, 3/8, 5/16, …), the
power series of (1 − x)^{-1/2}: its square is (1 − x)^{-1}, so the unbanded C satisfies C·C = A, the square-root
factorisation that is optimal for prefix sums among Toeplitz ones up to lower-order terms (Fichtenberger, Henzinger &
Upadhyay 2023; Henzinger et al. 2023). **Banded**: only the first b coefficients are kept (c_k = 0 for k ≥ b) — the
truncation, *not re-optimised* (Choquette-Choo et al. 2023 re-optimise the b bands numerically). The truncated
coefficients are kept because they are dyadic rationals (c_k = m_k/2^(2k − s₂(k)), s₂ the binary digit sum): C maps
a sum on the public grid γ (a power of two) onto the grid γ/2^v exactly (:func:`lattice_bits`), so the release C·x̄ + z
can be drawn as a discrete Gaussian on that lattice and stay exact in float64 (:mod:`protocols.dp.banded_release`).

**The recursion** (:class:`InverseRecursion`): C is lower triangular with c_0 = 1, so w = C^{-1}y is
w_t = y_t − Σ_{k=1}^{b−1} c_k·w_{t−k}: O(b·d) memory (the last b − 1 outputs), C^{-1} never formed. Applied to the
noise draws z it gives the noise recursion ẑ = C^{-1}z; the release applies it to the released y (a post-processing).

**Sensitivity** (Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta & Xu, "(Amplified) Banded Matrix
Factorization: A unified approach to private training", NeurIPS 2023, Theorem 2). *Conditions*: C is lower
triangular and b-banded (C[i, j] = 0 unless 0 ≤ i − j < b); a client participates in at most k of the n rounds, any
two of its rounds at least b apart. *Then* the L2 sensitivity of x ↦ Cx over such participations (each round's
contribution of L2 norm ≤ 1) is max over participation patterns π of sqrt(Σ_{i∈π} ‖C[:, i]‖²) ≤ √k·max_i ‖C[:, i]‖.
Why (adaptively, too): row t of C(x − x') is Σ_k c_k (x − x')_{t−k} over the client's rounds in the window
(t − b, t], at most one of them when its rounds are ≥ b apart, so ‖row t‖ ≤ c_{t−i}·1 for that one round i and the
squares sum to Σ_{i∈π} ‖C[:, i]‖². Under the cyclic schedule (:func:`secure_fed.participation.cyclic_cohort`:
client c in the rounds g, g + P, g + 2P, …, g = c mod P) the rounds are exactly P apart, so the conditions hold iff b ≤ P, with
k = ⌈n/P⌉; :func:`sensitivity` checks both and refuses otherwise (:func:`theorem_error`). The whole run is then one
Gaussian mechanism of noise multiplier σ/sens (no amplification by sampling is claimed: the schedule is public).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

#: the most bands a run may ask for (the lattice shrinks by 2^(2b) and the grid indices must stay below 2^52)
MAX_BANDS = 16


def sqrt_coefficients(count: int) -> list[Fraction]:
    """The first ``count`` coefficients c_k = binom(2k, k)/4^k of (1 − x)^{-1/2}, exactly."""
    return [Fraction(math.comb(2 * k, k), 4**k) for k in range(int(count))]


def band_coefficients(bands: int) -> np.ndarray:
    """The b-banded strategy's coefficients c_0 … c_{b−1} in float64 (exact: each is a dyadic rational)."""
    check_bands(bands)
    out = np.array([float(c) for c in sqrt_coefficients(bands)], dtype=np.float64)
    assert all(Fraction(float(c)) == c for c in sqrt_coefficients(bands))  # dyadic, so float64 holds them exactly
    return out


def lattice_bits(bands: int) -> int:
    """v: every c_k (k < b) is an integer multiple of 2^-v, so C maps γ·ℤ onto (γ/2^v)·ℤ (v = 2(b−1) − s₂(b−1))."""
    check_bands(bands)
    return max(c.denominator.bit_length() - 1 for c in sqrt_coefficients(bands))


def check_bands(bands: int) -> None:
    if not (isinstance(bands, int | np.integer) and 1 <= int(bands) <= MAX_BANDS):
        raise ValueError(f"bands must be a whole number from 1 to {MAX_BANDS}, not {bands!r}")


def strategy_matrix(n: int, bands: int | None = None) -> np.ndarray:
    """C: the n×n lower-triangular Toeplitz matrix of :func:`sqrt_coefficients`, kept to ``bands`` diagonals
    (None: all n, the unbanded square root). Dense: for tests and small n only."""
    b = n if bands is None else min(int(bands), n)
    coeffs = [float(c) for c in sqrt_coefficients(b)]
    C = np.zeros((n, n))
    for k, c in enumerate(coeffs):
        C += c * np.eye(n, k=-k)
    return C


def prefix_workload(n: int) -> np.ndarray:
    """A: the n×n lower-triangular all-ones matrix (prefix sums)."""
    return np.tril(np.ones((n, n)))


class InverseRecursion:
    """w = C^{-1}y for a stream y_0, y_1, … (numpy arrays or torch tensors): w_t = y_t − Σ_{k≥1} c_k·w_{t−k}, keeping
    only the last b − 1 outputs (O(b·d) memory)."""

    def __init__(self, coeffs: np.ndarray):
        self.coeffs = [float(c) for c in coeffs]
        if not self.coeffs or self.coeffs[0] != 1.0:
            raise ValueError("the recursion needs c_0 = 1")
        self.past: list = []  #: the last outputs, most recent first

    def step(self, y):
        w = y * 1.0  # a copy, in y's type
        for c, prev in zip(self.coeffs[1:], self.past, strict=False):
            w = w - c * prev
        self.past = [w, *self.past][: len(self.coeffs) - 1]
        return w


def noise_recursion(z_rows, bands: int) -> list:
    """ẑ = C^{-1}z for the rows z_0, z_1, … of the noise draws, by :class:`InverseRecursion`."""
    rec = InverseRecursion(band_coefficients(bands))
    return [rec.step(z) for z in z_rows]


def participations(rounds: int, period: int) -> int:
    """k: the most rounds of ``rounds`` one client is in under the cyclic schedule of period P (group 0's ⌈n/P⌉)."""
    return -(-int(rounds) // int(period)) if rounds > 0 else 0


def max_column_norm(rounds: int, bands: int) -> float:
    """max_i ‖C[:, i]‖ of the n×n b-banded C: its first column's, sqrt(Σ_{k < min(b, n)} c_k²)."""
    c = band_coefficients(bands)[: max(0, min(int(bands), int(rounds)))]
    return float(np.sqrt(np.sum(c * c)))


def theorem_error(bands: int, period: int) -> str | None:
    """Why Theorem 2's conditions fail for a b-banded C under the cyclic schedule of period P, or None."""
    check_bands(bands)
    if not (isinstance(period, int | np.integer) and period >= 1):
        return f"the participation period must be a whole number ≥ 1, not {period!r}"
    if bands > period:
        return (
            f"{bands} bands with a cyclic participation period of {period} rounds: a client's rounds are {period} apart, "
            f"fewer than the {bands} bands, so its contributions overlap in a row of C and the sensitivity "
            "√k·max‖C[:, i]‖ (Choquette-Choo et al. 2023, Theorem 2) does not hold; use bands ≤ the period "
            "(1/training.client_fraction)"
        )
    return None


def sensitivity(rounds: int, bands: int, period: int) -> float:
    """sens = √k·max_i ‖C[:, i]‖ for ``rounds`` rounds, k = :func:`participations` (in units of the clip norm);
    ValueError where the theorem's conditions fail (:func:`theorem_error`)."""
    if why := theorem_error(bands, period):
        raise ValueError(why)
    return math.sqrt(participations(rounds, period)) * max_column_norm(rounds, bands)


__all__ = [
    "MAX_BANDS", "InverseRecursion", "band_coefficients", "check_bands", "lattice_bits", "max_column_norm",
    "noise_recursion", "participations", "prefix_workload", "sensitivity", "sqrt_coefficients", "strategy_matrix",
    "theorem_error",
]  # fmt: skip
