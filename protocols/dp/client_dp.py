"""Client-level DP (DP-FedAvg, McMahan et al. 2018): clip on the client, noise on the sum.

Client side (:func:`clip_update`): the client's whole update — Δθ and its own
class-row deltas, as one vector — is scaled to L2 norm ≤ S.

Server side (:func:`noise_aggregate`): N(0, σ²S²) is added to every coordinate
of Σ Δθ and of the row sums (all C rows, participating or not), and the sums
are divided by fixed denominators: q·N for θ and q·(clients holding the row)
for each row, so one client's presence changes the released update by at most
S/(q·N) before noise. Accounting: one step at (σ, q) per round, q = expected
sampled clients / population (Poisson sampling).
"""

from __future__ import annotations

import math

import torch

from protocols.dp.randomness import SecretStream
from secure_fed.algorithms.base import Payload
from secure_fed.client_functions import client_step
from secure_fed.engine.aggregation import Aggregate
from secure_fed.models.sparse_rows import dense_delta


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
    """A copy of the reply whose (Δθ, Δrows) has L2 norm ≤ ``clip_norm``."""
    return scale_update(reply, min(1.0, clip_norm / max(update_norm(reply), 1e-12)))


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
def clip_step(reply: Payload, *, clip_norm: float, weight_cap: float | None = None) -> Payload:
    """Client side, the client-level DP step of every round: clip the update to ``clip_norm``, then (FLAG) bound
    its weight by ``weight_cap``. Registered, so a remote client runs it from the round's plan."""
    reply = clip_update(dense_update(reply), clip_norm)
    return cap_weight(reply, weight_cap) if weight_cap is not None else reply


def add_client_noise(
    reply: Payload, *, std: float, rows_shape: tuple[int, int] | None, stream: SecretStream, label: str
) -> Payload:
    """Distributed noise: this client's share N(0, std²) on every coordinate of Δθ and, if ``rows_shape``
    is given, of all C class rows (``row_noise``, added where the update is packed for the secure sum).

    ``stream`` is the client's own secret (never the server's, never the public seed)."""
    out = dense_update(reply)
    out["theta_delta"] = {
        n: t + (std * stream.gaussian(t.shape, f"{label} {n}")).to(t.device, t.dtype) for n, t in out["theta_delta"].items()
    }
    if rows_shape is not None:
        out["row_noise"] = (std * stream.gaussian(rows_shape, f"{label} rows")).float()
    return out


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

    ``stream`` is the server's secret; ``label`` names this round's draw."""
    std = noise_multiplier * clip_norm if server_noise else 0.0
    if std > 0.0:
        for n, s in agg.theta_sum.items():
            s.add_((std * stream.gaussian(s.shape, f"{label} {n}")).to(s.device, s.dtype))
    agg.theta_denominator = float(expected_clients)
    if noise_rows:
        if std > 0.0:
            agg.row_sum.add_(
                (std * stream.gaussian(agg.row_sum.shape, f"{label} rows")).to(agg.row_sum.device, agg.row_sum.dtype)
            )
        agg.row_denominator = expected_per_row.to(agg.row_sum.device)
    return agg
