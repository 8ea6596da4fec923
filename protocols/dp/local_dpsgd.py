"""DP-SGD inside client training (Abadi et al. 2016, as Opacus runs it), client side.

Each local step of client c:

1. **Poisson sampling**: every one of its n examples joins the batch independently with probability q
   (``privacy.local.batch_sample_rate``), drawn from the client's own secret; a local epoch is round(1/q)
   steps (Opacus's convention for Poisson loaders);
2. **per-sample clipping**: each sample's gradient g_i (θ and, when the client trains them, its class rows,
   as one vector) is scaled to ‖g_i‖ ≤ C;
3. **noise**: N(0, σ²C²) on every coordinate of the sum, from the client's own secret;
4. the step's gradient is (Σ_i clip(g_i) + noise) / (q·n): the sum over the *expected* batch size, as
   Opacus's ``DPOptimizer`` divides by ``expected_batch_size``.

The per-sample gradients themselves come from the core (:mod:`secure_fed.algorithms.per_sample`); the
accounting (one subsampled Gaussian step at (σ, q) per local step, for every client an instance sits on)
is the layer's (:mod:`protocols.dp.layer`).
"""

from __future__ import annotations

import torch

from protocols.dp.randomness import SecretStream
from secure_fed.algorithms.per_sample import GradientPrivatizer


def steps_per_epoch(sample_rate: float) -> int:
    """Poisson loaders make round(1/q) steps an epoch (at least one)."""
    return max(1, round(1.0 / sample_rate))


def clip_factors(grads: list[torch.Tensor], clip_norm: float) -> torch.Tensor:
    """(B,) factors min(1, C/‖g_i‖) of the per-sample gradients, ‖g_i‖ over every tensor of ``grads`` together."""
    sq = sum(torch.linalg.vector_norm(g.reshape(g.shape[0], -1), dim=1, dtype=torch.float32) ** 2 for g in grads)
    return (clip_norm / (sq.sqrt() + 1e-12)).clamp(max=1.0)


class LocalDPSGD(GradientPrivatizer):
    """One client's DP-SGD in one round: sampling and noise from ``stream`` (the client's secret), addressed by
    ``label`` (the round) and the step, so a resumed run redraws the same batches and noise."""

    def __init__(self, *, clip_norm: float, noise_multiplier: float, sample_rate: float, stream: SecretStream, label: str):
        self.clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.sample_rate = float(sample_rate)
        self.stream = stream
        self.label = label

    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.sample_rate)

    def batch(self, n: int, step: str) -> torch.Tensor:
        u = self.stream.uniform(n, f"{self.label} {step} sample")
        return torch.from_numpy((u < self.sample_rate).nonzero()[0])

    def clip_sum(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        f = clip_factors(grads, self.clip_norm)
        return [torch.einsum("b,b...->...", f.to(g.dtype), g) for g in grads]

    def finish(self, sums: list[torch.Tensor], n: int, step: str) -> list[torch.Tensor]:
        sizes = [s.numel() for s in sums]
        z = self.stream.gaussian((sum(sizes),), f"{self.label} {step} noise")
        std = self.noise_multiplier * self.clip_norm
        out, at = [], 0
        denom = self.sample_rate * max(n, 1)
        for s, k in zip(sums, sizes, strict=True):
            noise = (std * z[at : at + k]).to(s.dtype).reshape(s.shape).to(s.device)
            out.append((s + noise) / denom)
            at += k
        return out


def local_steps_per_round(*, local_epochs: int, sample_rate: float) -> int:
    """DP-SGD steps one client runs per round."""
    return local_epochs * steps_per_epoch(sample_rate)


def copies_per_round(max_clients_per_instance: int, cohort_size: int) -> int:
    """How many clients' local training one instance can enter in a round: the clients it sits on (at most
    ``max_clients_per_instance``), and no more than the cohort."""
    return max(0, min(int(max_clients_per_instance), int(cohort_size)))


__all__ = ["LocalDPSGD", "clip_factors", "copies_per_round", "local_steps_per_round", "steps_per_epoch"]
