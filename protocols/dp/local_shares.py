"""Distributed DP-FedSGD for the instance unit: ``privacy.local.noise: shares``.

Each client of the round runs ONE DP-SGD step over its Poisson batch (``privacy.local``'s sampling and per-sample
clipping to C); instead of adding the full noise σ(C + γ√d) to that step itself, it adds a discrete Gaussian
*share* of std σ(C + γ√d)/√t (t: the secure sum's survivor threshold, ``min_summands``) and sends its clipped and
noised gradient SUM — not a divided, averaged update — through secure aggregation. The server obtains only

    Σ_c (snap(s_c) + Z_c),   Var(Σ_c Z_c) ≥ σ²(C + γ√d)²   for a sum of ≥ t updates,

one central-noise release of the clipped per-instance gradients: √n-fold less noise than n clients each adding the
full σ(C + γ√d) (``noise: local``). This is ``privacy.client.noise: clients``'s share machinery
(:func:`protocols.dp.client_dp.add_client_noise`: the public grid, the share, the noise on every class row) applied
to the per-instance clipped sum.

Client side, in order:

1. :class:`LocalShareSums` (the round's privatizer) runs the client's one step and hands its clipped sum s_c (θ and,
   when it trains them, its class rows) to the layer; the client's model takes no step of its own (zero gradient:
   nothing un-noised can leave in the reply);
2. :func:`share_reply` (a plan step) puts −s_c, each coordinate clamped to ±(R − 10σ(C + γ√d)) so that secure
   aggregation's encoding range R never clips a share, into the reply, and adds the share. Clamping a coordinate is
   1-Lipschitz, so the sensitivity of the sum to one instance stays C (+ γ√d on the grid). The training loss is
   not sent (it would reach the server exactly, outside the noise).

Server side (:class:`LocalSharesRound`): no noise of its own; the sum is divided by public constants only — θ by
n̄·B/η (n̄ the expected cohort, B ``training.batch_size``, η ``training.client_lr``), each row by its expected
clients × B/η — so the released step is −η·Σ_c(s_c + Z_c)/(B·n̄), the DP-FedSGD step.

Accounting: one subsampled Gaussian step at (σ, q) per round (q ``privacy.local.batch_sample_rate``), for the one
client an instance sits on (:mod:`protocols.dp.share_rules` refuses more copies). Against the server this ε holds
only with the secure sum: it never sees one client's lightly-noised sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from protocols.dp.accountant import GRID_CORRECTION_BITS
from protocols.dp.client_dp import add_client_noise, update_dim
from protocols.dp.discrete_gaussian import release_grid
from protocols.dp.exact_sums import float64_sum_slack
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.layer_specs import SHARE_RANGE_SIGMAS
from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import Aggregate, Bounds, Payload, RoundSession, RoundWrapper, apply_client_plan

#: the plan step's name (a ``client_side`` method of the dp layer)
SHARE_STEP = "layer:dp.local_share_step"


class LocalShareSums(LocalDPSGD):
    """Client side, ``noise: shares``: DP-SGD's Poisson batch and per-sample clipping, then, instead of a noisy local
    step, ``sink(clipped sums)`` (the layer keeps them for :func:`share_reply`) and a zero gradient."""

    applies_weight_terms = False

    def __init__(self, *, sink: Callable[[dict[str, torch.Tensor]], None], **kw):
        super().__init__(**kw)
        self.sink = sink

    def finish(self, sums: dict[str, torch.Tensor], step: str) -> dict[str, torch.Tensor]:
        self.sink({n: s.detach().double().clone() for n, s in sums.items()})
        return {n: torch.zeros_like(s) for n, s in sums.items()}


def sum_slack(clip_norm: float) -> float:
    """What the client's clipped sum adds to C before the share's own grid, in the worst case: its samples' rounding
    to the DP-SGD step's grid γ_q (≤ γ_q√d_q/2 ≤ 2^-11·C, :func:`~protocols.dp.accountant.noise_grid`'s bound; the
    share's grid may be another, secure aggregation's 2^-frac_bits), plus the ghost-norm fast path's float64 error
    bound (:func:`~protocols.dp.exact_sums.float64_sum_slack`); the share's std is σ(C + γ√d + this)/√t."""
    return 2.0 ** -(GRID_CORRECTION_BITS + 1) * float(clip_norm) + float64_sum_slack(clip_norm)


def share_std(full: float, min_summands: int | None, *, on_node: bool, num_clients: int) -> float | Bounds:
    """A share's standard deviation σC/√t in the round's plan (``full`` = σC), as ``noise: clients`` gives it: on a
    node checking the server's plan, a range from σC/√t (t its own threshold, else the federation's N) to σC."""
    if on_node:
        n = min_summands or num_clients
        return Bounds(full / math.sqrt(n) * (1 - 1e-9), full * (1 + 1e-9))
    return float(full / math.sqrt(max(1, int(min_summands or 0))))


def share_reply(
    reply: Payload, sums: dict[str, torch.Tensor], *, std: float, sigma: float, rows_shape: tuple[int, int] | None,
    stream: SecretStream, label: str, clip_norm: float, finest_grid: float | None, clip_range: float,
) -> Payload:  # fmt: skip
    """The reply a client sends under ``noise: shares``: its clipped gradient sum, negated (so the server's divisor
    is positive), each coordinate clamped to ±(``clip_range`` − 10σ(C + γ√d)), with its noise share of std ``std``
    (σC/√t) on every coordinate of θ and, with ``rows_shape``, of all C class rows
    (:func:`~protocols.dp.client_dp.add_client_noise`); loss 0. ``sums`` are the names the client trained (θ's
    trainable parameters, ``rows``); a frozen parameter's delta is zero."""
    theta = reply["theta_delta"]
    d = update_dim(reply, rows_shape)
    slack = sum_slack(clip_norm)
    _, corrected = release_grid(clip_norm, d, finest_grid, slack=slack)
    bound = clip_range - SHARE_RANGE_SIGMAS * sigma * corrected
    if not bound > 0.0:
        raise ValueError(f"secure_aggregation.clip_range {clip_range:g} leaves no room for the noise shares")

    def neg(t: torch.Tensor) -> torch.Tensor:
        return (-t.double()).clamp_(-bound, bound)

    out = {**reply, "loss": 0.0}
    out["theta_delta"] = {n: neg(sums[n]).reshape(theta[n].shape) if n in sums else torch.zeros(theta[n].shape,
                          dtype=torch.float64) for n in theta}  # fmt: skip
    if "rows" in sums:
        out["rows_delta"] = neg(sums["rows"])
    elif "rows_delta" in out:
        out["rows_delta"] = torch.zeros_like(out["rows_delta"], dtype=torch.float64)
    return add_client_noise(out, std=std, rows_shape=rows_shape, stream=stream, label=label, clip_norm=clip_norm,
                            finest_grid=finest_grid, slack=slack)  # fmt: skip


class LocalSharesRound(RoundWrapper):
    """One round under ``noise: shares``: the clients' share step (in process as a remote node runs it, from the
    round's plan), and the server's public divisors. ``layer`` is the dp layer (its plan steps, its public facts)."""

    def __init__(self, inner: RoundSession, *, layer, round_idx: int):
        super().__init__(inner)
        self.layer, self.round_idx = layer, round_idx

    def client_mod(self, fn):
        steps, layer = self._plan_steps([]), self.layer

        def shared(payload, data):
            return apply_client_plan(fn(payload, data), steps, data=data, layers={layer.name: layer})

        return self.inner.client_mod(shared)

    def client_plan(self) -> list[dict]:
        return self._plan_steps(self.inner.client_plan())

    def _plan_steps(self, inner_steps: list[dict]) -> list[dict]:
        if self.min_summands is None:
            raise RuntimeError("privacy.local.noise: shares needs a secure-sum layer outside dp")
        return self.layer.client_plan_steps(inner_steps, round_idx=self.round_idx, min_summands=self.min_summands)

    def post_own(self, agg: Aggregate) -> Aggregate:
        """Public divisors only: θ's sum by n̄·B/η, each row's by its expected clients × B/η (the sums hold −Σ(s + Z))."""
        layer = self.layer
        t, n = layer.settings.training, layer.env.num_clients
        expected = t.client_fraction * n if t.sampling == "poisson" else float(t.cohort_size(n))
        per_step = float(t.batch_size) / float(t.client_lr)
        agg.theta_denominator = expected * per_step
        if layer.noise_rows:
            agg.row_denominator = (expected / n) * layer.env.clients_per_row.float().to(agg.row_sum.device) * per_step
        return agg


__all__ = ["LocalShareSums", "LocalSharesRound", "SHARE_STEP", "share_reply", "share_std", "sum_slack"]
