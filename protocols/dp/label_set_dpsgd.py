"""Instance-level DP-SGD on the server's class-embedding update (FedALC eqs. 11 and 12).

The privacy unit is one label set (one training instance's labels, as the
server collected them). Each step:

1. Poisson-sample label sets with rate q;
2. compute each sampled set's gradient G_j = ∇_W ℓ_j(W) (``regularizers.label_set_*_grads``)
   and clip it to L2 norm ≤ C;
3. add N(0, σ²C²) to every entry of the sum;
4. divide by the expected batch q·n_all and step W ← normalize(W − λη·g̃).

With q = 1, σ = 0 and C = ∞ this is exactly one step on the σ-weighted
regulariser (tested), so the only change from the non-private algorithm is
the mechanism itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

#: ``per_set_grads(W)`` prepares everything that depends on W alone (pair gradients, neighbours) once per
#: step and returns a function of a chunk of label sets (B, C) → per-set gradients (B, C, d).
PerSetGrads = Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


def dp_label_set_step(
    W: torch.Tensor,
    label_sets: torch.Tensor,
    per_set_grads: PerSetGrads,
    *,
    clip_norm: float,
    noise_multiplier: float,
    sample_rate: float,
    step_size: float,
    generator: torch.Generator,
    chunk: int = 64,
) -> dict[str, float]:
    """One DP-SGD step on W in place; returns stats (batch size, fraction of clipped sets, grad norm)."""
    n_all = label_sets.shape[0]
    pick = torch.rand(n_all, generator=generator) < sample_rate
    batch = label_sets[pick].to(W.device)
    total = torch.zeros_like(W)
    clipped, norms_sum = 0, 0.0
    grads_of = per_set_grads(W)
    for start in range(0, batch.shape[0], chunk):
        G = grads_of(batch[start : start + chunk])
        norms = G.flatten(1).norm(dim=1)
        factor = (clip_norm / norms.clamp(min=1e-12)).clamp(max=1.0)
        total += torch.einsum("b,brd->rd", factor, G)
        clipped += int((norms > clip_norm).sum())
        norms_sum += float(norms.sum())
    noise = torch.randn(W.shape, generator=generator, dtype=torch.float64).to(W.device, W.dtype)
    g = (total + noise_multiplier * clip_norm * noise) / (sample_rate * max(n_all, 1))
    with torch.no_grad():
        W.sub_(step_size * g)
        W.copy_(F.normalize(W, dim=-1))
    b = int(batch.shape[0])
    return {"dp_batch": b, "dp_clipped_frac": clipped / max(b, 1), "dp_mean_grad_norm": norms_sum / max(b, 1)}
