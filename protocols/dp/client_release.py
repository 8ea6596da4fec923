"""The client unit's release (``privacy.client``), and the client side of every dp mechanism that runs on clients.

Client side: DP-SGD in training (:func:`local_privatizer`) and each round's plan (:func:`client_plan_steps`): the clip
to S (the weight cap inside it), and with ``noise: clients`` this client's noise share (:func:`noise_share_reply`);
under ``privacy.local.noise: shares`` the share step (:func:`local_share_reply`). Server side
(:class:`ClientNoiseRound`): every plaintext update checked clipped, then the noise (the server's, the tree's
increment, or none where the clients' shares carry it) and the public denominators; adaptive clipping's bits counted.
"""

from __future__ import annotations

import math
from typing import Any

from protocols.dp import adaptive_clipping
from protocols.dp.client_dp import add_client_noise, noise_aggregate, update_norm
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.dp.local_shares import SHARE_STEP, LocalShareSums, share_reply, share_std
from protocols.dp.run_graph import CLIENT_STEP
from protocols.dp.tree_aggregation import tree_release
from secure_fed.plugin_api.layers import (
    Aggregate,
    Bounds,
    ClientData,
    ClientFn,
    Payload,
    PrivacyViolation,
    RoundSession,
    RoundWrapper,
    apply_client_plan,
)


def client_plan_steps(
    layer, inner: list[dict], *, round_idx: int, min_summands: int | None = None, on_node: bool = False
) -> list[dict]:
    """Remote clients, under ``privacy.client``: the clip (and weight cap) as a registered step; with ``noise:
    clients`` then the noise share, drawn by the client's own copy of the dp ``layer`` from the client's own secret
    stream; then the inner sessions' steps. The plan holds public values only (the share's standard deviation
    σ·S/√t, t = ``min_summands``, and the label that addresses the draw). ``on_node`` (a node checking the
    server's plan) the standard deviation is a range: at most σ·S (t ≥ 1) and at least σ·S/√t with the t the
    node's own state knows (its SecAgg threshold), else σ·S/√N, N the federation's clients (no sum holds more);
    a relative 1e-9 of slack on both ends (the node calibrates σ itself)."""
    env, privacy = layer.env, layer.settings.privacy
    rows = [env.num_labels, env.embedding_dim] if layer.noise_rows else None
    if layer.local_shares:  # (privacy.client is refused with it)
        full = layer.units["instance"].mechanism(CLIENT_STEP).sigma * privacy.local.clip_norm
        return [{
            "op": SHARE_STEP,
            "std": share_std(full, min_summands, on_node=on_node, num_clients=env.num_clients),
            "rows": rows,
            "label": f"local share r{round_idx}",
        }, *inner]  # fmt: skip
    unit = layer.units.get("client")
    if unit is None:
        return inner
    step: dict[str, Any] = {"op": "dp.clip", "clip_norm": float(unit.clip_norm)}
    if layer.adaptive is not None:
        step["report_bit"] = True
    if privacy.client.weight_cap is not None:
        step["weight_cap"] = float(privacy.client.weight_cap)
    steps = [step]
    if privacy.client.noise == "clients":
        full = unit.sigma * unit.clip_norm
        if on_node:
            n = min_summands or env.num_clients
            std: float | Bounds = Bounds(full / math.sqrt(n) * (1 - 1e-9), full * (1 + 1e-9))
        else:  # an empty cohort (no client trains, no share is drawn) has a sum of no updates
            std = float(full / math.sqrt(max(1, int(min_summands or 0))))
        steps.append({"op": "layer:dp.noise_share_step", "std": std, "rows": rows, "label": f"noise share r{round_idx}"})
    return [*steps, *inner]


def local_privatizer(layer, cid: int, round_idx: int) -> LocalDPSGD | None:
    """Client side: client ``cid``'s DP-SGD for this round (``privacy.local``), drawing from the client's own secret;
    under ``noise: shares`` its clipped sum is kept in ``layer._local_sums`` for the share step."""
    if layer.settings.privacy.local is None:
        return None
    mech = layer.units["instance"].mechanism(CLIENT_STEP)
    kw = {"clip_norm": mech.clip_norm, "noise_multiplier": mech.sigma, "sample_rate": mech.sample_rate,
          "divisor": layer.settings.training.batch_size, "stream": layer.client_stream(cid),
          "label": f"dp-sgd r{round_idx}"}  # fmt: skip
    if layer.local_shares:  # its clipped sum, kept for the share step (local_share_step)
        return LocalShareSums(sink=lambda sums: layer._local_sums.__setitem__(int(cid), sums), **kw)
    return LocalDPSGD(**kw, copy_clip=layer.settings.privacy.local.copy_clip,
                      copies_bound=int(layer.env.max_clients_per_instance))  # fmt: skip


def noise_share_reply(layer, reply: Payload, data: ClientData, *, std: float, rows: list[int] | None, label: str) -> Payload:
    """Client side, ``privacy.client.noise: clients`` (a plan step): this client's noise share from its own secret
    stream, as the in-process ``client_mod`` adds it."""
    rows_shape = None if rows is None else (int(rows[0]), int(rows[1]))
    # the training loss would reach the server inside the secure sum, exactly and outside the noise: not sent
    reply = {**reply, "loss": 0.0}
    return add_client_noise(
        reply, std=std, rows_shape=rows_shape, stream=layer.client_stream(data.client_id), label=label,
        clip_norm=layer.units["client"].clip_norm, finest_grid=layer.settings.encoding_grid,
    )  # fmt: skip


def local_share_reply(layer, reply: Payload, data: ClientData, *, std: float, rows: list[int] | None, label: str) -> Payload:
    """Client side, ``privacy.local.noise: shares`` (a plan step): the client's clipped gradient sum of this round
    (kept by its :class:`~protocols.dp.local_shares.LocalShareSums`) with its noise share, from its own secret
    stream, in place of the trained update (:func:`~protocols.dp.local_shares.share_reply`)."""
    sums = layer._local_sums.pop(int(data.client_id), None)
    if sums is None:
        raise RuntimeError(f"client {data.client_id}: no clipped gradient sum this round (privacy.local.noise: shares)")
    mech = layer.units["instance"].mechanism(CLIENT_STEP)
    return share_reply(
        reply, sums, std=std, sigma=mech.sigma, rows_shape=None if rows is None else (int(rows[0]), int(rows[1])),
        stream=layer.client_stream(data.client_id), label=label, clip_norm=mech.clip_norm,
        finest_grid=layer.settings.encoding_grid, clip_range=layer.settings.encoding[0],
    )  # fmt: skip


class ClientNoiseRound(RoundWrapper):
    """One round of the client unit: the clients' plan (clip, noise share) and the server's release of the sum."""

    bit_sum = 0.0  #: adaptive clipping: Σ of the submitted clients' centred bits

    def __init__(self, inner: RoundSession, *, layer, round_idx: int):
        super().__init__(inner)
        self.layer, self.round_idx, self.unit = layer, round_idx, layer.units["client"]
        self.on_clients = layer.settings.privacy.client.noise == "clients"
        self.tree = layer.settings.privacy.client.mechanism == "tree"
        self.noise_rows = layer.noise_rows

    def client_mod(self, fn: ClientFn) -> ClientFn:
        """Client side: clip the whole update to S (FLAG: its eq. 2 weight bounded inside, ``weight_cap``);
        with ``noise: clients`` also add this client's noise share, from its own secret stream. The steps
        and their arguments are the round's plan (:meth:`client_plan`), run here as a remote node runs them."""
        steps, layer = self._plan_steps([]), self.layer

        def clipped(payload, data):
            return apply_client_plan(fn(payload, data), steps, data=data, layers={layer.name: layer})

        return self.inner.client_mod(clipped)

    def client_plan(self) -> list[dict]:
        return self._plan_steps(self.inner.client_plan())

    def _plan_steps(self, inner_steps: list[dict]) -> list[dict]:
        if self.on_clients and self.min_summands is None:
            raise RuntimeError("privacy.client.noise: clients needs a secure-sum layer outside dp")
        return self.layer.client_plan_steps(inner_steps, round_idx=self.round_idx, min_summands=self.min_summands)

    def submit(self, cid: int, reply) -> None:
        """Server side: a plaintext update must arrive clipped (a client that skipped the clip would break
        the sensitivity the noise is calibrated to): refused above S."""
        unit = self.unit
        if not self.on_clients:
            norm = update_norm(reply)
            if not norm <= unit.clip_norm * (1 + 1e-5):  # NaN fails too
                raise PrivacyViolation(
                    f"client {cid}'s update has L2 norm {norm:.6g}, above privacy.client.clip_norm "
                    f"{unit.clip_norm:g}: it was not clipped"
                )
            if "weight" in reply and float(reply["weight"]) != 1.0:  # the sum would count it w times
                raise PrivacyViolation(
                    f"client {cid}'s update carries weight {reply['weight']}: under client DP a weight is "
                    "capped inside the clipped update and reported as 1 (privacy.client.weight_cap)"
                )
        if self.layer.adaptive is not None:
            reply = dict(reply)
            bit = reply.pop(adaptive_clipping.BIT_KEY, None)
            if bit not in (adaptive_clipping.BIT_BELOW, adaptive_clipping.BIT_ABOVE):  # the count's sensitivity
                raise PrivacyViolation(f"client {cid}'s clip bit is {bit!r}, not ±1/2: refused")
            self.bit_sum += bit
        self.inner.submit(cid, reply)

    def post_own(self, agg: Aggregate) -> Aggregate:
        layer, unit, round_idx = self.layer, self.unit, self.round_idx
        banded = getattr(layer, "banded_noise", None)  # banded MF: x̄_t + ẑ_t; denominators at the cyclic rate 1/P
        q = unit.sample_rate if banded is None else 1.0 / unit.mechanism().period
        if banded is not None:
            banded.release(agg, round_idx=round_idx, clip_norm=unit.clip_norm, noise_multiplier=unit.sigma,
                           noise_rows=self.noise_rows)  # fmt: skip
        if self.tree:  # DP-FTRL: the leaf plus the tree's noise increment; denominators as below (q = 1)
            tree_release(agg, clip_norm=unit.clip_norm, noise_multiplier=unit.sigma, noise=layer.tree_noise,
                         round_idx=round_idx, tree_rounds=unit.tree_rounds, noise_rows=self.noise_rows)  # fmt: skip
        # an empty cohort (Poisson sampling) has no one to add noise shares: the server draws the whole
        # σS itself, so the release is the sampled Gaussian mechanism's on an empty sample, as accounted
        out = noise_aggregate(
            agg, clip_norm=unit.clip_norm,
            noise_multiplier=unit.sigma if layer.adaptive is None else layer.adaptive[1],  # σ_Δ: Theorem 1
            expected_clients=q * layer.env.num_clients, expected_per_row=q * layer.env.clients_per_row.float(),
            noise_rows=self.noise_rows, stream=layer.server_stream, label=f"client noise r{round_idx}",
            server_noise=not self.tree and banded is None and (not self.on_clients or agg.num_clients == 0),
        )  # fmt: skip
        if layer.adaptive is not None:
            layer.adaptive[0].close(round_idx, self.bit_sum, layer.server_stream, f"clip bit r{round_idx}")
        return out


__all__ = ["ClientNoiseRound", "client_plan_steps", "local_privatizer", "local_share_reply", "noise_share_reply"]
