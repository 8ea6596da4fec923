"""DP-SGD inside client training (Abadi et al. 2016, as Opacus runs it), client side.

Each local step of client c:

1. **Poisson sampling**: every one of its n examples joins the batch independently with probability q
   (``privacy.local.batch_sample_rate``), drawn from the client's own secret; a local epoch is round(1/q)
   steps (Opacus's convention for Poisson loaders);
2. **per-sample clipping**: each sample's gradient g_i (θ and, when the client trains them, its class rows,
   as one vector) is scaled to ‖g_i‖ ≤ C (``copy_clip: split``: to C/√k_i, k_i the clients its instance sits on);
3. **noise**: discrete Gaussian noise of std σ·(C + γ√d) on every coordinate of the sum rounded to the public grid
   γ (:mod:`protocols.dp.discrete_gaussian`; γ√d ≤ 2^-10·C), from the client's own secret (``split``: σ·(C +
   √m·(γ√d + slack)), :meth:`LocalDPSGD.noise_sensitivity`);
4. the step's gradient is (Σ_i clip(g_i) + noise) / B with B = ``training.batch_size``, a *public* constant.
   (Opacus's ``DPOptimizer`` divides by the expected batch q·n; with the client's own n that divisor would
   change when an instance is added or removed, scaling every other gradient and the noise, which add/remove
   accounting at sensitivity C does not cover.)

The per-sample gradients themselves come from the core (:mod:`secure_fed.algorithms.per_sample`); the
accounting (one subsampled Gaussian step at (σ, q) per local step, for every client an instance sits on; with
``split``, one full-batch Gaussian step per local step whatever the clients it sits on) is the layer's
(:mod:`protocols.dp.layer`).
"""

from __future__ import annotations

import math

import torch

from protocols.dp.discrete_gaussian import grid_noise, release_grid, snap
from protocols.dp.exact_sums import check_float_batch, clip_factors, float64_sum_slack, grid_clipped_sum, per_sample_norms64
from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import GradientPrivatizer


def steps_per_epoch(sample_rate: float) -> int:
    """Poisson loaders make round(1/q) steps an epoch (at least one)."""
    return max(1, round(1.0 / sample_rate))


def per_sample_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """(B,) float64 norms ‖g_i‖ of the per-sample gradients, over every tensor of ``grads`` together
    (:func:`protocols.dp.exact_sums.per_sample_norms64`: float64, so that the clip holds for the computed vector)."""
    return per_sample_norms64(grads)


class LocalDPSGD(GradientPrivatizer):
    """One client's DP-SGD in one round: sampling and noise from ``stream`` (the client's secret), addressed by
    ``label`` (the round) and the step, so a resumed run redraws the same batches and noise. ``divisor`` is the
    public constant the noisy sum is divided by (``training.batch_size``).

    ``copy_clip`` ``split`` (``privacy.local.copy_clip``): a sample whose instance sits on k clients is clipped to
    C/√k (:meth:`clip_scales`), so the instance's clipped copies over all its clients have L2 norm ≤ C together; each
    release's noise then covers C + √m·(γ√d + slack) (m = ``copies_bound``, the public bound on k): the k copies'
    grid roundings add up in L2 (:meth:`noise_sensitivity`)."""

    def __init__(
        self, *, clip_norm: float, noise_multiplier: float, sample_rate: float, divisor: float, stream: SecretStream,
        label: str, copy_clip: str = "full", copies_bound: int = 1,
    ):  # fmt: skip
        if copy_clip not in ("full", "split"):
            raise ValueError(f"copy_clip is full or split, not {copy_clip!r}")
        if copy_clip == "split" and float(sample_rate) < 1.0:  # its ledger holds only when every copy is in every step
            raise ValueError(f"copy_clip split needs full-batch steps (sample rate 1), not {sample_rate:g}")
        if int(copies_bound) < 1:
            raise ValueError(f"copies_bound {copies_bound} must be ≥ 1")
        self.copy_clip, self.copies_bound = copy_clip, int(copies_bound)
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.divisor = float(divisor)
        self.stream = stream
        self.label = label

    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.sample_rate)

    def batch(self, n: int, step: str) -> torch.Tensor:
        u = self.stream.uniform(n, f"{self.label} {step} sample")
        return torch.from_numpy((u < self.sample_rate).nonzero()[0])

    def instance_uniforms(self, keys, m: int, step: str) -> torch.Tensor:
        """Per-instance uniforms from the client's secret, keyed by each instance's content key
        (:meth:`~protocols.randomness.SecretStream.keyed_uniform`): removing an instance leaves every other
        instance's draws as they were."""
        return torch.from_numpy(self.stream.keyed_uniform(keys, m, f"{self.label} {step} per-instance"))

    def clip_scales(self, copies: torch.Tensor | None) -> torch.Tensor | None:
        """``split``: (B,) float64 1/√k_i, k_i the clients sample i's instance sits on (≤ ``copies_bound``, else refused:
        the noise covers √m grid roundings only); None where every instance sits on one client (``copies`` None and
        a bound of 1). ``full``: None (every sample clipped to C)."""
        if self.copy_clip != "split":
            return None
        if copies is None:  # a clip of C per copy would break the one-copy ledger wherever an instance has several
            if self.copies_bound > 1:
                raise ValueError("copy_clip split needs each sample's copy count (ClientData.copies); the client has none")
            return None
        k = torch.as_tensor(copies, dtype=torch.float64)
        if len(k) and (k.min() < 1 or k.max() > self.copies_bound):
            raise ValueError(f"an instance on {int(k.max())} clients exceeds the contribution bound {self.copies_bound}")
        return k.rsqrt()

    def factors(self, norms: torch.Tensor, scales: torch.Tensor | None = None) -> torch.Tensor:
        """(B,) float64 factors min(1, s_i·C(1 − 2^-20)/‖g_i‖) (:func:`~protocols.dp.exact_sums.clip_factors`: the
        computed clipped vector's norm is ≤ s_i·C; s_i = 1 without ``scales``). The ghost-norm fast path calls this once
        for its whole batch, whose float64 sum is accounted for at most :data:`~protocols.dp.exact_sums.MAX_FLOAT_BATCH`
        samples: a larger one is refused."""
        check_float_batch(len(norms))
        if scales is None:
            return clip_factors(norms, self.clip_norm)
        scales = scales.to(device=norms.device, dtype=torch.float64)
        if len(scales) != len(norms) or bool((scales <= 0).any() or (scales > 1).any()):
            raise ValueError("clip scales: one per sample, each in (0, 1]")
        return clip_factors(norms.double() / scales, self.clip_norm)

    def sum_grid(self, dim: int) -> float:
        """The release grid γ of this client's step over ``dim`` trained coordinates (the one :meth:`finish` snaps to)."""
        return release_grid(self.clip_norm, dim)[0]

    def clip_sum(self, grads: dict[str, torch.Tensor], scales: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The chunk's clipped sum, exact: each sample's clipped vector rounded to the release grid on its own and the
        integer grid indices summed in float64 (:func:`~protocols.dp.exact_sums.grid_clipped_sum`; a rounded vector
        moves by ≤ γ√d/2, inside the accounted C + γ√d). Without DP (σ = 0 or C = ∞) a plain float64 sum."""
        f = self.factors(per_sample_norms(list(grads.values())), scales)
        if self.noise_multiplier == 0.0 or not math.isfinite(self.clip_norm):
            return {n: torch.einsum("b,b...->...", f.to(g.device), g.double()) for n, g in grads.items()}
        grid = self.sum_grid(sum(g[0].numel() for g in grads.values()))
        return grid_clipped_sum(grads, f, grid, self.clip_norm)

    def sensitivity_slack(self) -> float:
        """What the sum's formation adds to C in the worst case: the ghost-norm fast path's float64 sum
        (:func:`~protocols.dp.exact_sums.float64_sum_slack`, 2·γ_{N+1}·N·C ≈ 2^-20·C); the exact per-sample path
        needs nothing, but which path runs is the model's, so every step's noise covers both."""
        return float64_sum_slack(self.clip_norm)

    def noise_sensitivity(self, dim: int) -> tuple[float, float]:
        """(γ, the L2 sensitivity σ multiplies) of a release over ``dim`` coordinates: C + γ√d + slack (one copy, or
        ``full``); ``split``: C + √m·(γ√d + slack), the k ≤ m copies' clipped parts (√k·C/√k = C together) and each
        copy's rounding and float64 error (added in L2 over the copies, each client's release noised on its own)."""
        grid, corrected = release_grid(self.clip_norm, dim, slack=self.sensitivity_slack())
        if self.copy_clip == "split":
            corrected = self.clip_norm + math.sqrt(self.copies_bound) * (corrected - self.clip_norm)
        return grid, corrected

    def finish(self, sums: dict[str, torch.Tensor], step: str) -> dict[str, torch.Tensor]:
        """The released step: the clipped sums (float64; exact, or within the float64 bound) rounded to the public grid
        γ and γ·Z added, Z discrete Gaussian of std σ·(C + γ√d + slack)/γ (:mod:`protocols.dp.discrete_gaussian`, one
        draw over every trained tensor in a fixed order), then divided by the public divisor and cast to the trained
        parameters' dtype by the caller (post-processing of the on-grid values)."""
        names = sorted(sums)  # a fixed order of the one noise vector over every trained tensor
        sizes = [sums[n].numel() for n in names]
        if self.noise_multiplier == 0.0:  # no DP noise (ε = ∞): the plain clipped step
            return {n: sums[n] / self.divisor for n in names}
        grid, corrected = self.noise_sensitivity(sum(sizes))
        z = grid_noise(sum(sizes), self.noise_multiplier * corrected, grid, self.stream, f"{self.label} {step} noise")
        out, at = {}, 0
        for n, k in zip(names, sizes, strict=True):
            s = sums[n]
            noisy = snap(s, grid).add_(z[at : at + k].reshape(s.shape).to(s.device))
            out[n] = (noisy / self.divisor).to(s.dtype)
            at += k
        return out


def local_steps_per_round(*, local_epochs: int, sample_rate: float) -> int:
    """DP-SGD steps one client runs per round."""
    return local_epochs * steps_per_epoch(sample_rate)


def copies_per_round(max_clients_per_instance: int, cohort_size: int) -> int:
    """How many clients' local training one instance can enter in a round: the clients it sits on (at most
    ``max_clients_per_instance``), and no more than the cohort."""
    return max(0, min(int(max_clients_per_instance), int(cohort_size)))


__all__ = ["LocalDPSGD", "per_sample_norms", "copies_per_round", "local_steps_per_round", "steps_per_epoch"]
