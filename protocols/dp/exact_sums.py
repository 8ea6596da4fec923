"""Sums before the grid snap: exact where each contribution is materialised, float64 with a proven bound where not.

Every DP release of secure-fed is snap(S) + γ·Z (:mod:`protocols.dp.discrete_gaussian`): S a sum of clipped
contributions, rounded to the public grid γ. The accounted sensitivity of the rounded sum is Δ + γ√d
(:func:`protocols.dp.accountant.grid_sensitivity`); it covers the *exact* sum. A sum formed in float32 (or bf16)
is not exact: its error, a function of every contribution, is as large as 2·γ_n·n·C in the worst case (γ_n =
n·u/(1 − n·u), u the unit roundoff), which for float32 and a few hundred samples is many times the grid's margin.
Two ways out, both here:

**Exact (fixed point).** Each clipped contribution c_i (a function of one sample alone) is rounded to the release
grid γ, coordinate by coordinate: k_i = round(c_i/γ), an integer vector, and S = γ·Σ k_i is summed in float64 of
integer values, exact while every partial sum stays below 2^53 (checked: n·(C/γ + 1) < 2^53, with C/γ ≈ 2^10·√d
about 2^32 samples for d = 3.45M). The rounded contribution has norm ≤ ‖c_i‖ + γ√d/2, so two neighbouring sums
differ by at most Δ + (Δ/C)·γ√d/2 ≤ Δ + γ√d for Δ/C ≤ 2 (DP-SGD: one contribution, Δ = C; the W step: a merged
label set replaced, two contributions, Δ = 2C), and the sum is already on the grid, so the snap is the identity:
the accounted Δ + γ√d covers it with nothing added (:func:`grid_clipped_sum`).

**Float64 with its bound.** Where the per-sample contributions are never materialised (the ghost-norm fast path,
Σ_i (f_i g_i) a_iᵀ as one matrix product) the sum is computed in float64 from float32 inputs, and every computed
entry is within γ_{m}·Σ_i |v_i| of the exact sum of the (rounded-factor) contributions v_i, for any summation order
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., eq. (3.5) and §4.2; m = n + 1: n − 1 additions,
one product, one accumulation into the running sum). In L2: ‖err‖ ≤ γ_m·‖Σ_i |v_i|‖ ≤ γ_m·Σ_i ‖v_i‖ ≤ γ_m·n·C.
Two neighbouring sums each carry one such error, so the released sum's sensitivity is Δ + 2·γ_{N+1}·N·C with N a
*public* cap on n (:data:`MAX_FLOAT_BATCH` samples; a larger batch is refused): :func:`float64_sum_slack`, added to
Δ where the noise std is computed (:func:`protocols.dp.discrete_gaussian.release_grid`'s ``slack``).

**The clip itself.** ‖c_i‖ ≤ C must hold for the *computed* contribution: the norms are taken in float64 (the
squares of float32 values are exact in float64, the sum of d of them within a relative γ_d(2^-53)), the factor is
min(1, C·(1 − 2^-20)/‖g_i‖), and the product f_i·g_i is rounded once more (relative 2^-53 in float64): the margin
2^-20 covers all of these for d < 2^30 (:func:`clip_factors`).
"""

from __future__ import annotations

import torch

#: float64's unit roundoff
U64 = 2.0**-53
#: the clip's relative safety margin: the factor is C·(1 − 2^-20)/‖g‖, which covers the float64 norm's error
#: (≤ γ_d(2^-53) ≈ 1.1·10^-16·d, below 2^-23 for d < 2^30) and the rounding of the product f·g
CLIP_MARGIN = 2.0**-20
#: the most coordinates a per-sample norm may have for the margin to cover its float64 error
MAX_NORM_DIM = 2**30
#: the public cap on the number of summands of a float64 sum with a bounded error (the ghost-norm fast path's batch):
#: its worst-case error, 2·γ_{N+1}·N·C, is then ≈ 2^-20·C (2.86·10^-6·C)
MAX_FLOAT_BATCH = 2**16
#: integer-valued float64 sums are exact while every partial sum is below this
EXACT_FLOAT64_INTEGER = 2.0**53


def gamma_n(n: int, u: float = U64) -> float:
    """Higham's γ_n = n·u/(1 − n·u): the relative error bound of n floating-point operations in a chain (n·u < 1)."""
    nu = float(n) * u
    if not nu < 1.0:
        raise ValueError(f"γ_n is defined for n·u < 1 (n = {n}, u = {u})")
    return nu / (1.0 - nu)


def float64_sum_error(n: int, clip_norm: float) -> float:
    """The worst-case L2 error of a float64 sum of ``n`` vectors of norm ≤ ``clip_norm`` (each term one product and
    its share of the additions, plus one accumulation into a running sum): γ_{n+1}·n·C."""
    return gamma_n(int(n) + 1) * int(n) * float(clip_norm)


def float64_sum_slack(clip_norm: float, cap: int = MAX_FLOAT_BATCH) -> float:
    """What a float64 sum of at most ``cap`` clipped contributions adds to the sensitivity of the released sum: each
    of two neighbouring sums carries an error of at most :func:`float64_sum_error`, so 2·γ_{N+1}·N·C."""
    return 2.0 * float64_sum_error(cap, clip_norm)


def check_float_batch(n: int) -> None:
    """Refuse a float64 sum of more summands than the public cap its bound (:func:`float64_sum_slack`) assumes."""
    if int(n) > MAX_FLOAT_BATCH:
        raise ValueError(
            f"a DP-SGD batch of {n} samples exceeds {MAX_FLOAT_BATCH}, the public cap of the float64 sum's accounted "
            "error bound (protocols.dp.exact_sums): lower privacy.local.batch_sample_rate (copy_clip: split needs 1, so "
            "use copy_clip: full with a lower rate)"
        )


def clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """(B,) float64 factors min(1, C·(1 − 2^-20)/‖g_i‖) from float64 ``norms``, so that the computed f_i·g_i has norm
    ≤ C whatever the rounding of the norm and of the product (see the module docstring)."""
    norms = norms.double()
    return ((float(clip_norm) * (1.0 - CLIP_MARGIN)) / norms.clamp(min=1e-300)).clamp(max=1.0)


def per_sample_norms64(grads: list[torch.Tensor]) -> torch.Tensor:
    """(B,) float64 norms ‖g_i‖ over every tensor of ``grads`` together (each ``(B, …)``)."""
    dim = sum(g[0].numel() for g in grads) if grads else 0
    if dim > MAX_NORM_DIM:
        raise ValueError(f"per-sample gradients of {dim} coordinates exceed the clip margin's {MAX_NORM_DIM}")
    sq = sum(g.reshape(g.shape[0], -1).double().pow(2).sum(1) for g in grads)
    return torch.as_tensor(sq, dtype=torch.float64).sqrt()


def check_exact_capacity(n: int, clip_norm: float, grid: float) -> None:
    """Refuse a grid sum whose integer partial sums could reach 2^53 (n·(C/γ + 1) ≥ 2^53): float64 would round them."""
    if int(n) * (float(clip_norm) / float(grid) + 1.0) >= EXACT_FLOAT64_INTEGER:
        raise ValueError(f"{n} contributions of norm {clip_norm:g} on the grid {grid:g} overflow float64's exact integers")


def grid_round(contrib: torch.Tensor, grid: float) -> torch.Tensor:
    """Each contribution (``(B, …)`` float64) rounded to the grid γ, as float64 grid indices (integers)."""
    return torch.round(contrib / float(grid))


def grid_clipped_sum(
    grads: dict[str, torch.Tensor], factors: torch.Tensor, grid: float, clip_norm: float
) -> dict[str, torch.Tensor]:
    """Σ_i γ·round(f_i·g_i/γ) for each name: every per-sample contribution f_i·g_i (``grads`` ``(B, …)`` by name,
    together one vector per sample; ``factors`` (B,) float64) computed in float64, rounded to the grid on its own,
    and the integer indices summed exactly in float64. Returns float64 sums on the grid γ."""
    n = len(factors)
    check_exact_capacity(n, clip_norm, grid)
    out = {}
    for name, g in grads.items():
        f = factors.to(g.device, torch.float64).reshape(-1, *([1] * (g.dim() - 1)))
        k = grid_round(g.double() * f, grid)
        out[name] = k.sum(0) * float(grid)  # integer partial sums < 2^53: exact, in any order
    return out


def on_grid_exactly(x: torch.Tensor, grid: float) -> bool:
    """Every value of ``x`` an integer multiple of ``grid`` (a check for tests)."""
    k = x.double() / float(grid)
    return bool(torch.equal(k, torch.round(k))) and bool(k.abs().max() < EXACT_FLOAT64_INTEGER) if x.numel() else True


__all__ = [
    "CLIP_MARGIN", "MAX_FLOAT_BATCH", "check_exact_capacity", "check_float_batch", "clip_factors", "float64_sum_error",
    "float64_sum_slack", "gamma_n", "grid_clipped_sum", "grid_round", "on_grid_exactly", "per_sample_norms64",
]  # fmt: skip
