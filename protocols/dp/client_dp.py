"""Client-level DP (DP-FedAvg, McMahan et al. 2018): clip on the client, noise on the sum.

Client side (:func:`clip_update`): the client's whole update — Δθ and its own
class-row deltas, as one vector — is scaled to L2 norm ≤ S.

Server side (:func:`noise_aggregate`): discrete Gaussian noise of std σ·(S + γ√d) is added to every
coordinate of Σ Δθ and of the row sums (all C rows, participating or not), rounded to the public grid γ
(:mod:`protocols.dp.discrete_gaussian`; γ√d ≤ 2^-10·S), and the sums
are divided by fixed denominators: q·N for θ and q·(clients holding the row)
for each row, so one client's presence changes the released update by at most
S/(q·N) before noise. Accounting: one step at (σ, q) per round, q = expected
sampled clients / population (Poisson sampling).
"""

from __future__ import annotations

import math

import torch

from protocols.dp.adaptive_clipping import BIT_KEY, clip_bit
from protocols.dp.discrete_gaussian import grid_noise, release_grid, snap, snap_and_noise
from protocols.dp.exact_sums import CLIP_MARGIN
from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import Aggregate, Payload, SecureFedError, client_step, dense_delta


def dense_update(reply: Payload) -> Payload:
    """The reply with every θ update dense (clipping and noise act on the whole update; the engine sends no
    row-sparse update under client-level DP, see ``LayerSpec.row_sparse_updates``, but a caller might)."""
    return {**reply, "theta_delta": {n: dense_delta(t) for n, t in reply["theta_delta"].items()}}


def update_norm(reply: Payload) -> float:
    sq = sum(float(dense_delta(t).double().pow(2).sum()) for t in reply["theta_delta"].values())
    if "rows_delta" in reply:
        sq += float(reply["rows_delta"].double().pow(2).sum())
    return math.sqrt(sq)


def scale_update(reply: Payload, f: float) -> Payload:
    """A copy of the reply with (Δθ, Δrows) multiplied by ``f``."""
    out = dict(reply)
    out["theta_delta"] = {n: t * f for n, t in reply["theta_delta"].items()}
    if "rows_delta" in reply:
        out["rows_delta"] = reply["rows_delta"] * f
    return out


def clip_update(reply: Payload, clip_norm: float) -> Payload:
    """A copy of the reply whose (Δθ, Δrows) has L2 norm ≤ ``clip_norm``, as computed: the factor keeps the margin
    2^-20 of :func:`protocols.dp.exact_sums.clip_factors` (the float64 norm's error and the rounding of the scaled
    float32 update, relative 2^-24, stay inside it)."""
    return scale_update(reply, min(1.0, clip_norm * (1.0 - CLIP_MARGIN) / max(update_norm(reply), 1e-12)))


def cap_weight(reply: Payload, weight_cap: float) -> Payload:
    """Bounded client weights (FLAG under client-level DP): a reply that carries its own aggregation ``weight`` w
    (computed from the client's data) has its — already clipped — update scaled by min(w, W̄)/W̄ ≤ 1 and reports
    weight 1. The update's norm stays ≤ S, so the sensitivity holds; w leaves the client only inside the update the
    noise covers; the fixed denominator then makes the released step (1/qN) Σ_c min(w_c, W̄)/W̄ · Δ̃_c: FLAG's
    relative weighting (for w_c ≤ W̄), scaled by the mean capped weight. A reply without ``weight`` is returned as is."""
    if "weight" not in reply:
        return reply
    return {**scale_update(reply, min(float(reply["weight"]), weight_cap) / weight_cap), "weight": 1.0}


@client_step("dp.clip")
def clip_step(reply: Payload, *, clip_norm: float, weight_cap: float | None = None, report_bit: bool = False) -> Payload:
    """Client side, the client-level DP step of every round: clip the update to ``clip_norm``, then (FLAG) bound
    its weight by ``weight_cap``; with ``report_bit`` (adaptive clipping) also report the centred bit of whether the
    update was within ``clip_norm`` (:func:`protocols.dp.adaptive_clipping.clip_bit`). Registered, so a remote
    client runs it from the round's plan."""
    reply = dense_update(reply)
    bit = clip_bit(update_norm(reply), clip_norm) if report_bit else None
    reply = clip_update(reply, clip_norm)
    reply = cap_weight(reply, weight_cap) if weight_cap is not None else reply
    return reply if bit is None else {**reply, BIT_KEY: bit}


#: the smallest noise share, in grid steps: Kairouz–Liu–Steinke's τ is then below 10^-150 per summand
#: (:func:`protocols.dp.discrete_gaussian.distributed_tau`), so the secure sum of the shares has the Rényi divergences of
#: the discrete Gaussian of their total variance to double precision; the ledger's curve carries no τ, so a smaller
#: share is refused (its ε would not hold)
MIN_SHARE_GRID_STEPS = 6.0


def _refuse_small_share(share: float, grid: float) -> None:
    """A share below :data:`MIN_SHARE_GRID_STEPS` grid steps: Kairouz–Liu–Steinke's correction τ·d is then not
    negligible and the ledger does not carry it, so the client refuses to send the update (nothing is released). It
    happens only at a σ whose ε is enormous anyway (on the sensitivity's own grid, σ ≲ 6·2^-10·√(t/d)), or with a
    very coarse ``secure_aggregation.frac_bits``."""
    raise SecureFedError(
        f"privacy.client.noise: clients: a noise share of std {share:.4g} is {share / grid:.3g} steps of the grid {grid:g}; "
        f"below {MIN_SHARE_GRID_STEPS:g} steps the secure sum of discrete Gaussian shares is not provably within a "
        "negligible distance of one (Kairouz, Liu & Steinke 2021), which the reported ε assumes: raise "
        "secure_aggregation.frac_bits or σ"
    )


def update_dim(reply: Payload, rows_shape: tuple[int, int] | None) -> int:
    """Coordinates of the released sum a client's update enters: every θ entry and, with ``rows_shape``, all C rows."""
    d = sum(math.prod(t.shape) for t in reply["theta_delta"].values())
    return int(d + (math.prod(rows_shape) if rows_shape is not None else 0))


def add_client_noise(
    reply: Payload, *, std: float, rows_shape: tuple[int, int] | None, stream: SecretStream, label: str,
    clip_norm: float, finest_grid: float | None = None, slack: float = 0.0,
) -> Payload:  # fmt: skip
    """Distributed noise: this client's share on every coordinate of Δθ and, if ``rows_shape`` is given, of all C
    class rows (``row_noise``, added where the update is packed for the secure sum).

    The update is rounded to the public grid γ (:func:`protocols.dp.discrete_gaussian.release_grid` for sensitivity
    ``clip_norm`` over every coordinate, no finer than ``finest_grid``, secure aggregation's 2^-frac_bits) and the
    share is γ·Z, Z ~ N_Z(0, (std'/γ)²) with std' = ``std``·(S + γ√d)/S, the share of the grid-corrected noise: Δθ,
    the client's row deltas and ``row_noise`` are float64 multiples of γ, which the fixed-point encoding carries
    exactly, so the secure sum is exactly γ·(Σ rounded updates + Σ Z_c) (the sum of discrete Gaussian shares:
    :mod:`protocols.dp.discrete_gaussian`, Kairouz–Liu–Steinke 2021).

    ``slack`` is what the update's own formation adds to its sensitivity in the worst case (``noise: shares``: the
    clipped sum's per-sample grid rounding and float64 error, :func:`protocols.dp.local_shares.sum_slack`): the
    share is then ``std``·(S + γ√d + slack)/S.

    ``stream`` is the client's own secret (never the server's, never the public seed)."""
    out = dense_update(reply)
    grid, corrected = release_grid(clip_norm, update_dim(out, rows_shape), finest_grid, slack=slack)
    share = std * corrected / clip_norm
    if 0.0 < share < MIN_SHARE_GRID_STEPS * grid:
        _refuse_small_share(share, grid)
    out["theta_delta"] = {n: snap_and_noise(t, share, grid, stream, f"{label} {n}") for n, t in out["theta_delta"].items()}
    if "rows_delta" in out:
        out["rows_delta"] = snap(out["rows_delta"], grid)
    if rows_shape is not None:
        out["row_noise"] = grid_noise(math.prod(rows_shape), share, grid, stream, f"{label} rows").reshape(rows_shape)
    return out


def released_sums(agg, *, noise_rows: bool, clip_norm: float, noise_multiplier: float) -> tuple[dict, float, float]:
    """The aggregate's sums the server releases (θ's, and W's rows when they are noised too), the public grid γ over
    all their coordinates and the noise std σ·(C + γ√d) on it (:func:`protocols.dp.discrete_gaussian.release_grid`)."""
    sums = dict(agg.theta_sum)
    if noise_rows:
        sums["rows"] = agg.row_sum
    grid, corrected = release_grid(clip_norm, sum(s.numel() for s in sums.values()))
    return sums, grid, noise_multiplier * corrected


def noise_aggregate(
    agg: Aggregate,
    *,
    clip_norm: float,
    noise_multiplier: float,
    expected_clients: float,
    expected_per_row: torch.Tensor,
    noise_rows: bool,
    stream: SecretStream,
    label: str,
    server_noise: bool = True,
) -> Aggregate:
    """Gaussian noise on the sums (unless the clients added it) and fixed denominators (in place on ``agg``).

    The noise is the discrete Gaussian on a public grid (:func:`protocols.dp.discrete_gaussian.snap_and_noise`): the
    sums are rounded to γ = :func:`~protocols.dp.discrete_gaussian.release_grid` (sensitivity S over all their
    coordinates) and γ·Z is added, std σ·(S + γ√d); the released sums are multiples of γ (then held in the
    aggregate's dtype, a post-processing).

    ``stream`` is the server's secret; ``label`` names this round's draw."""
    if server_noise and noise_multiplier > 0.0:
        sums, grid, std = released_sums(agg, noise_rows=noise_rows, clip_norm=clip_norm, noise_multiplier=noise_multiplier)
        for n, s in sums.items():
            s.copy_(snap_and_noise(s, std, grid, stream, f"{label} {n}"))
    agg.theta_denominator = float(expected_clients)
    if noise_rows:
        agg.row_denominator = expected_per_row.to(agg.row_sum.device)
    return agg
