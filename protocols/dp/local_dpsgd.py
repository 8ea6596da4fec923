"""DP-SGD inside client training (Abadi et al. 2016, as Opacus runs it), client side.

Each local step of client c:

1. **Poisson sampling**: every one of its n examples joins the batch independently with probability q
   (``privacy.local.batch_sample_rate``), drawn from the client's own secret; a local epoch is round(1/q)
   steps (Opacus's convention for Poisson loaders);
2. **per-sample clipping**: each sample's gradient g_i (θ and, when the client trains them, its class rows,
   as one vector) is scaled to ‖g_i‖ ≤ C;
3. **noise**: discrete Gaussian noise of std σ·(C + γ√d) on every coordinate of the sum rounded to the public grid
   γ (:mod:`protocols.dp.discrete_gaussian`; γ√d ≤ 2^-10·C), from the client's own secret;
4. the step's gradient is (Σ_i clip(g_i) + noise) / B with B = ``training.batch_size``, a *public* constant.
   (Opacus's ``DPOptimizer`` divides by the expected batch q·n; with the client's own n that divisor would
   change when an instance is added or removed, scaling every other gradient and the noise, which add/remove
   accounting at sensitivity C does not cover.)

The per-sample gradients themselves come from the core (:mod:`secure_fed.algorithms.per_sample`); the
accounting (one subsampled Gaussian step at (σ, q) per local step, for every client an instance sits on)
is the layer's (:mod:`protocols.dp.layer`).
"""

from __future__ import annotations

import torch

from protocols.dp.discrete_gaussian import grid_noise, release_grid, snap
from protocols.randomness import SecretStream
from secure_fed.algorithms.per_sample import GradientPrivatizer


def steps_per_epoch(sample_rate: float) -> int:
    """Poisson loaders make round(1/q) steps an epoch (at least one)."""
    return max(1, round(1.0 / sample_rate))


def per_sample_norms(grads: list[torch.Tensor]) -> torch.Tensor:
    """(B,) norms ‖g_i‖ of the per-sample gradients, over every tensor of ``grads`` together."""
    sq = sum(torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1, dtype=torch.float32) ** 2 for g in grads)
    return sq.sqrt()


class LocalDPSGD(GradientPrivatizer):
    """One client's DP-SGD in one round: sampling and noise from ``stream`` (the client's secret), addressed by
    ``label`` (the round) and the step, so a resumed run redraws the same batches and noise. ``divisor`` is the
    public constant the noisy sum is divided by (``training.batch_size``)."""

    def __init__(
        self, *, clip_norm: float, noise_multiplier: float, sample_rate: float, divisor: float, stream: SecretStream,
        label: str,
    ):  # fmt: skip
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

    def factors(self, norms: torch.Tensor) -> torch.Tensor:
        return (self.clip_norm / (norms.float() + 1e-12)).clamp(max=1.0)

    def clip_sum(self, grads: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        f = self.factors(per_sample_norms(list(grads.values())))
        return {n: torch.einsum("b,b...->...", f.to(g.dtype), g) for n, g in grads.items()}

    def finish(self, sums: dict[str, torch.Tensor], step: str) -> dict[str, torch.Tensor]:
        """The released step: the clipped sums rounded to the public grid γ and γ·Z added, Z discrete Gaussian of std
        σ·(C + γ√d)/γ (:mod:`protocols.dp.discrete_gaussian`, one draw over every trained tensor in a fixed order),
        then divided by the public divisor and held in each sum's dtype (post-processing of the on-grid values)."""
        names = sorted(sums)  # a fixed order of the one noise vector over every trained tensor
        sizes = [sums[n].numel() for n in names]
        if self.noise_multiplier == 0.0:  # no DP noise (ε = ∞): the plain clipped step
            return {n: sums[n] / self.divisor for n in names}
        grid, corrected = release_grid(self.clip_norm, sum(sizes))
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
