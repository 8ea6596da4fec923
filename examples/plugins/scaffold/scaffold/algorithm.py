"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
Algorithm 1 with option II control variates).

Client i keeps its control variate c_i (its own state, never sent) and corrects each local step by the server's c:
y ← y − η(g_i(y) − c_i + c), a weight term of the client objective (it reads no example: under DP-SGD it is added
after the noise). After its K steps, option II: c_i⁺ = c_i − c + (x − y_i)/(Kη) = c_i − c − Δθ_i/(Kη).

The server's update c ← c + (1/N) Σ_{i∈S} (c_i⁺ − c_i) = c + (|S|/N)·mean_S(−c − Δθ_i/(Kη)) needs nothing beyond the
mean update Δ̄ = mean_S Δθ_i, which the server receives anyway (noised under ``dp``, a secure sum's under secure
aggregation): the control variate is derived from that release (:meth:`Scaffold.server_aggregate`), so no client
sends c_i or its change. The server keeps ĉ = Kη·c, in the update's units, ĉ ← ĉ + (|S|/N)(−ĉ − Δ̄), and sends it;
client i reads c = ĉ/(K_i η) with its own number of steps K_i. Where every client takes the same K (DP-SGD's fixed
steps per epoch; equal client sizes) this is the paper's option II exactly, and c is the mean of the clients' c_i
(uniform aggregation, full participation, no noise); with unequal K_i it is the natural per-client reading of the
mean drift.
"""

from __future__ import annotations

import torch

from scaffold.params import ScaffoldParams
from secure_fed.plugin_api import (
    AffineTerm,
    Algorithm,
    ClientData,
    ClientObjective,
    ObjectiveContext,
    Params,
    Payload,
    SetupContext,
)

#: where a client keeps c_i in its own state
STATE_KEY = "scaffold_c_i"


class ControlVariates(ClientObjective):
    """c − c_i added to every step's gradient; c_i updated by option II at the end, in the client's own state."""

    name = "scaffold"
    weight_only = True
    affine = True  # a constant: rate 0, offset c − c_i (the vectorised executor adds it in its closed form)

    def __init__(self, control: dict[str, torch.Tensor]):
        self.control = control  # ĉ = Kη·c, as the server sent it

    def begin(self, ctx: ObjectiveContext) -> None:
        k_eta = max(ctx.planned_steps, 1) * ctx.lr
        c = {n: t.detach() / k_eta for n, t in self.control.items()}
        c_i = ctx.state.get(STATE_KEY) or {n: torch.zeros_like(t) for n, t in c.items()}
        ctx.scratch.update(c=c, c_i=c_i, correction={n: c[n] - c_i[n] for n in c})

    def affine_term(self, ctx: ObjectiveContext) -> AffineTerm:
        return AffineTerm(offset=ctx.scratch["correction"])

    def end(self, ctx: ObjectiveContext, theta_delta: dict[str, torch.Tensor]) -> None:
        k_eta = max(ctx.steps, 1) * ctx.lr
        c, c_i = ctx.scratch["c"], ctx.scratch["c_i"]
        ctx.state[STATE_KEY] = {n: c_i[n] - c[n] - theta_delta[n].to(c[n].dtype) / k_eta for n in c}


class Scaffold(Algorithm):
    params = ScaffoldParams
    keeps_client_state = True
    reads_aggregate = True
    #: ĉ travels down with θ's shapes (a function of earlier releases: public); the uplink is FedAvg's
    downlink_rules = {**Algorithm.downlink_rules, "control": Params("theta")}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        #: ĉ = Kη·c, the server's control variate in the update's units (zeros until the first round)
        self.control: dict[str, torch.Tensor] | None = None
        #: N, the federation's size (public)
        self.num_clients = 0

    def setup(self, ctx: SetupContext) -> dict:
        self.num_clients = ctx.num_clients
        return {}

    def downlink(self, theta, W, known_labels) -> Payload:
        payload = super().downlink(theta, W, known_labels)
        if self.control is None:
            self.control = {n: torch.zeros_like(t) for n, t in theta.items()}
        payload["control"] = self.control
        return payload

    def client_objective(self, payload: Payload, data: ClientData) -> ClientObjective:
        return ControlVariates(payload["control"])

    def server_aggregate(self, theta_mean: dict[str, torch.Tensor], num_clients: float) -> None:
        """ĉ ← ĉ + (|S|/N)(−ĉ − Δ̄): the control variates' mean change, from the released mean update and the public
        count the core passes (under DP its fixed denominator q·N, so |S|/N is the public rate q)."""
        if self.control is None or num_clients <= 0:
            return
        f = num_clients / max(self.num_clients, num_clients)
        self.control = {n: c + f * (-c - theta_mean[n].to(c.dtype)) for n, c in self.control.items()}

    def state_dict(self) -> dict:
        return {"control": self.control, "num_clients": self.num_clients}

    def load_state_dict(self, state: dict) -> None:
        self.control, self.num_clients = state["control"], int(state["num_clients"])
