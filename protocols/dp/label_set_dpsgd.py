"""Instance-level DP-SGD on the server's class-embedding update (FedALC eqs. 11 and 12).

The privacy unit is one training instance. The server holds the instances' label sets (from
label-set collection); each step:

1. Poisson-sample label sets with rate q;
2. compute each sampled set's gradient G_j = ∇_W ℓ_j(W) (``regularizers.label_set_*_grads``)
   and clip it to L2 norm ≤ C;
3. sum them exactly (each clipped gradient rounded to the release grid γ on its own, the integer grid indices
   summed in float64: :mod:`protocols.dp.exact_sums`) and add discrete Gaussian noise of std σ·(2C + γ√d) to every entry
   (:mod:`protocols.dp.discrete_gaussian`);
4. divide by the public expected batch B̄ (``privacy.instance.expected_batch_size``, a config value,
   never the realised count of label sets) and step W ← normalize(W − λη·g̃).

**Why a public divisor.** Dividing by q·n_all (the realised number of label sets) makes the noise's
scale a function of the data: on the neighbouring pair where every clipped gradient is 0 and the
removed instance is alone in its set, the two outputs are Gaussians whose variances differ by
(n/(n−1))², which add/remove accounting at sensitivity 2C does not cover (an exact χ² bound gave
ε ≥ 2.38 on Bibtex at 50 rounds where the accountant reported 0.997). With B̄ from config the map
from the noisy sum to the step is fixed post-processing.

**Why 2C.** Label-set collection merges identical feature vectors into one set (their tokens
are equal), and it unions their labels. Removing one instance therefore either removes a set
(change ≤ C) or *changes* a set into another (the set of a duplicate with other labels: change
≤ 2C, both clipped to C). The server cannot tell which sets are merges, so every step is
accounted at sensitivity Δ = 2C: σ stays the noise multiplier of the accountant, and the noise
std is σ·Δ (tested with merged instances in ``tests/protocols/test_dp.py``).

The Poisson draws and the noise are passed in: the caller draws them from the server's secret
stream (:mod:`protocols.randomness`), never from the public seed; the noise is the discrete
Gaussian on a public grid (:func:`protocols.dp.discrete_gaussian.noisy_sum`).

With q = 1, σ = 0 and C = ∞ this is exactly one step on the σ-weighted
regulariser (tested), so the only change from the non-private algorithm is
the mechanism itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import scipy.sparse as sp
import torch
from torch.nn import functional as F

from protocols.dp.discrete_gaussian import release_grid
from protocols.dp.exact_sums import clip_factors, grid_clipped_sum, per_sample_norms64
from secure_fed.plugin_api.layers import PER_SET_CHUNK_ELEMENTS  # elements (chunk × C × d) of one chunk's per-set gradients

#: ``per_set_grads(W)`` prepares everything that depends on W alone (pair gradients, neighbours) once per
#: step and returns a function of a chunk of label sets (B, C) → per-set gradients (B, C, d).
PerSetGrads = Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]


#: sensitivity of the clipped sum of per-set gradients, in units of the clip norm C (see above)
SENSITIVITY_IN_CLIP_NORMS = 2.0


def dp_label_set_step(
    W: torch.Tensor,
    label_sets: torch.Tensor,
    per_set_grads: PerSetGrads,
    *,
    clip_norm: float,
    noise_multiplier: float,
    divisor: float,
    step_size: float,
    pick: torch.Tensor,
    noise: Callable[[torch.Tensor, float, float], torch.Tensor],
    chunk: int | None = None,
) -> dict[str, float]:
    """One DP-SGD step on W in place; returns diagnostics (batch size, clipped fraction, mean norm).

    ``pick`` (n_all,) bool is the Poisson sample; ``noise(total, σ, Δ)`` returns the released noisy sum
    (σ the noise multiplier, Δ = 2C the sensitivity). Both come from the caller's secret stream.
    ``divisor`` is the public expected batch size B̄ (config): the noisy sum is divided by it whatever the
    realised sample. The diagnostics are statistics of private data: they belong in the run's private
    diagnostics, never in a released file.
    """
    if not divisor > 0:
        raise ValueError(f"the W step's divisor must be a positive public number, got {divisor!r}")
    if sp.issparse(label_sets):  # the algorithm's CSR label sets: densified one chunk at a time
        batch = sp.csr_matrix(label_sets)[pick.cpu().numpy()]
    else:
        batch = label_sets[pick.to(label_sets.device)].to(W.device)
    if chunk is None:  # the per-set gradients of a chunk are (chunk, C, d): keep them near PER_SET_CHUNK_ELEMENTS
        chunk = int(min(64, max(1, PER_SET_CHUNK_ELEMENTS // max(1, W.numel()))))
    # the sum is exact: each set's clipped gradient rounded to the release grid on its own, the integer grid indices
    # summed in float64 (protocols.dp.exact_sums; a merged set's replacement moves the sum by ≤ 2C + γ√d, the
    # accounted sensitivity of the rounded sum), so the release's snap is the identity on it
    private = noise_multiplier > 0.0 and math.isfinite(clip_norm)
    grid = release_grid(SENSITIVITY_IN_CLIP_NORMS * clip_norm, W.numel())[0] if private else None
    total = torch.zeros_like(W, dtype=torch.float64)
    clipped, norms_sum = 0, 0.0
    grads_of = per_set_grads(W)
    for start in range(0, batch.shape[0], chunk):
        Yb = batch[start : start + chunk]
        if sp.issparse(Yb):
            Yb = torch.from_numpy(Yb.toarray()).to(W.device)
        G = grads_of(Yb)
        norms = per_sample_norms64([G])
        factor = clip_factors(norms, clip_norm)
        if grid is not None:
            total += grid_clipped_sum({"W": G}, factor, grid, clip_norm)["W"]
        else:  # no DP: a plain float64 sum
            total += torch.einsum("b,brd->rd", factor, G.double())
        clipped += int((norms > clip_norm).sum())
        norms_sum += float(norms.sum())
    noisy = noise(total, noise_multiplier, SENSITIVITY_IN_CLIP_NORMS * clip_norm).to(W.device, W.dtype)
    g = noisy / float(divisor)
    with torch.no_grad():
        W.sub_(step_size * g)
        W.copy_(F.normalize(W, dim=-1))
    b = int(batch.shape[0])
    return {"dp_batch": b, "dp_clipped_frac": clipped / max(b, 1), "dp_mean_grad_norm": norms_sum / max(b, 1)}
