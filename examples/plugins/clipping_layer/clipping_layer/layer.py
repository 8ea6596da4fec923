"""The clipping layer: one hook, :meth:`Clipping.clients`, whose client mod scales the client's update to L2 norm at
most ``max_norm``.

The update is what the algorithm's client sends: Δθ (``theta_delta``) and, where the client trains its class rows,
their deltas (``rows_delta``), clipped together as one vector (as DP-FedAvg clips). Other reply keys (the number of
examples, the loss, a weight) pass unchanged.

Threat model, honestly: clipping bounds how far one client can move a round's average (a client's mistake, or an
outlier's pull), which is also the sensitivity a DP layer would calibrate noise to. By itself it is no privacy
protection: nothing is noised, so no ε holds; the server sees each clipped update (or its secure sum). It runs on the
client, so a client that does not run it is not stopped: the server does not verify the norm.
"""

from __future__ import annotations

import math

from secure_fed.plugin_api.layers import ClientSide, ProtocolLayer, dense_delta


def clip(reply: dict, max_norm: float) -> dict:
    """A copy of ``reply`` whose (Δθ, Δrows) has L2 norm ≤ ``max_norm``."""
    theta = {n: dense_delta(t) for n, t in reply["theta_delta"].items()}
    parts = [*theta.values(), *([reply["rows_delta"]] if "rows_delta" in reply else [])]
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in parts))
    scale = min(1.0, max_norm / max(norm, 1e-12))
    out = {**reply, "theta_delta": {n: t * scale for n, t in theta.items()}}
    if "rows_delta" in reply:
        out["rows_delta"] = reply["rows_delta"] * scale
    return out


class Clipping(ProtocolLayer):
    """``protocols: [clipping, ...]``: built with its :class:`~clipping_layer.config.ClippingSection`."""

    name = "clipping"

    def clients(self) -> ClientSide:
        max_norm = self.settings.max_norm

        def mod(fn):
            def clipped(payload, data):
                return clip(fn(payload, data), max_norm)

            return clipped

        return ClientSide(mod=mod)
