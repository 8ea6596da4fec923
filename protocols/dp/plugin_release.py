"""The run's half of the DP mechanism plugins (:mod:`protocols.dp.mechanism_plugins`): their declared mechanisms,
the clients' bounded vectors, the one noised release and the answer to an algorithm's setup query for it.

Declared mechanisms: each plugin is two registered kinds, ``<name>`` (unit ``instance``, noise multiplier σ over the
instance sensitivity Δ_i) and ``<name>_client`` (unit ``client``, declared only with ``privacy.client``), both on the
channel of its statistic, one step at q = 1, noise added by the server. The release is
:func:`protocols.dp.discrete_gaussian.noisy_sum` of the clients' summed vectors at (σ, Δ_i): std σ·(Δ_i + γ√d) on the
grid γ (γ√d ≤ 2^-10·Δ_i). Against the client unit its multiplier is that std over the client sensitivity of the
rounded sum, Δ_c + γ√d, at least σ·Δ_i / (Δ_c + 2^-10·Δ_i), the value declared (:func:`client_sigma`)."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import torch

from protocols.dp.accountant import GRID_CORRECTION_BITS
from protocols.dp.discrete_gaussian import noisy_sum
from protocols.dp.mechanism_plugins import MechanismSpec, active_plugins, mechanism_specs, plugin_channel
from protocols.dp.mechanisms import CLIENT, INSTANCE, DPMechanism, _ClientGaussian, register_mechanism
from secure_fed.plugin_api.layers import ClientData, Payload, client_function

#: the payload keys of the plugins' setup exchange (the dp layer's spec declares their rules)
MECHANISM, INSTANCE_BOUND, CLIENT_CLIP, VECTOR = "mechanism", "instance_bound", "client_clip", "mechanism_vector"
SERVER_WHY = "the server sums the clients' bounded vectors and adds the noise itself"


@cache
def mechanism_class(name: str, unit: str) -> type[DPMechanism]:
    """The registered mechanism class of plugin ``name`` for ``unit`` (created and registered on first use)."""
    spec = mechanism_specs()[name]
    attrs = {
        "kind": name if unit == INSTANCE else f"{name}_client", "unit": unit, "channel": plugin_channel(spec.statistic),
        "releases": (spec.statistic,), "noise_by": "server", "sample_known_to_server": True, "server_why": SERVER_WHY,
        "__doc__": f"The {name} plugin's release ({spec.statistic}), accounted per {unit}.", "plugin": name,
    }  # fmt: skip
    base = DPMechanism if unit == INSTANCE else _ClientGaussian
    return register_mechanism(type(f"Plugin_{name}_{unit}", (base,), attrs))


def kind_of(name: str) -> str | None:
    """The mechanism kind a run declares under ``name`` when it is a plugin's (``<name>`` or ``<name>_client``)."""
    specs = mechanism_specs()
    if name in specs:
        return mechanism_class(name, INSTANCE).kind
    if name.endswith("_client") and name[: -len("_client")] in specs:
        return mechanism_class(name[: -len("_client")], CLIENT).kind
    return None


def client_sigma(spec: MechanismSpec, section: Any, sigma: float) -> float:
    """The client unit's noise multiplier of a release at instance multiplier ``sigma`` (a lower bound, see module)."""
    d_i, d_c = spec.sensitivity(section, INSTANCE), spec.sensitivity(section, CLIENT)
    return float(sigma) * d_i / (d_c + 2.0**-GRID_CORRECTION_BITS * d_i)


@client_function
def plugin_client(payload: Payload, data: ClientData) -> Payload:
    """Client side: the named plugin's vector from this client's own data, bounded as the payload's public bounds say."""
    spec = mechanism_specs()[str(payload[MECHANISM])]
    clip = float(payload[CLIENT_CLIP])
    vec = spec.client_function()(data, instance_bound=float(payload[INSTANCE_BOUND]), client_clip=clip if clip > 0 else None)
    return {VECTOR: torch.as_tensor(vec, dtype=torch.float64).reshape(-1).cpu()}


def clip_l2(vec: torch.Tensor, bound: float) -> torch.Tensor:
    """``vec`` scaled down to L2 norm ``bound`` where it is longer."""
    norm = float(torch.linalg.vector_norm(vec))
    return vec * (bound / norm) if norm > bound else vec


def release(layer, query) -> dict[str, torch.Tensor]:
    """Server side, before round 0: each active plugin's one release (the clients' bounded vectors summed, the
    discrete Gaussian added from the server's secret stream), charged to the ledgers once; by statistic."""
    out: dict[str, torch.Tensor] = {}
    client_unit = layer.units.get("client")
    inst = layer.units["instance"]
    for spec, section in active_plugins(layer.settings.privacy):
        d_i = spec.sensitivity(section, INSTANCE)
        clip = spec.client_clip(section) if client_unit is not None else 0.0
        mech = inst.mechanism(spec.name)
        payload = {MECHANISM: spec.name, INSTANCE_BOUND: float(d_i), CLIENT_CLIP: float(clip)}
        replies = query(lambda _cid, payload=payload: dict(payload), plugin_client)
        total = torch.zeros(layer.env.num_labels, dtype=torch.float64)
        for _, reply in replies:
            vec = reply[VECTOR].to(torch.float64)
            # with a client unit the server enforces the client clip itself (a remote node's reply is not trusted to)
            total += clip_l2(vec, clip) if clip > 0 else vec
        out[spec.statistic] = noisy_sum(total, sigma=mech.sigma, sensitivity=d_i, stream=layer.server_stream,
                                        label=f"{spec.name} release")  # fmt: skip
        if mech.steps == 0:  # once a run: a resumed run redraws the same release (addressed by its label)
            inst.step(1, spec.name)
            if client_unit is not None:
                client_unit.step(1, f"{spec.name}_client")
    return out


def answer_statistics(released: dict[str, torch.Tensor]):
    """The wrapper of the algorithm's setup query: a query whose payload asks for a released ``statistic`` is answered
    with the one released sum (from no client: ``cid`` -1), without asking the clients; any other passes through."""

    def wrap(query):
        def wrapped(payload_fn, client_fn):
            first = payload_fn(0)
            name = first.get("statistic") if isinstance(first, dict) else None
            if name in released:
                return [(-1, {name: released[name].clone()})]
            return query(payload_fn, client_fn)

        return wrapped

    return wrap


def plugin_mechanisms(privacy, *, with_client: bool) -> list[dict[str, Any]]:
    """The instance unit's entries for the active plugins (as :mod:`protocols.dp.privacy_units` declares its
    mechanisms: name, settings block, q, planned steps, scope, sensitivity)."""
    out = []
    for spec, section in active_plugins(privacy):
        mechanism_class(spec.name, INSTANCE)
        if with_client:
            mechanism_class(spec.name, CLIENT)
        scope = f"their share of the released {spec.statistic} ({spec.name}: one noised sum before round 0)"
        out.append({"name": spec.name, "block": section, "sample_rate": 1.0, "planned_steps": 1,
                    "clip_norm": instance_sensitivity(spec, section), "scope": scope})  # fmt: skip
    return out


def instance_sensitivity(spec: MechanismSpec, section: Any) -> float:
    d = float(spec.sensitivity(section, INSTANCE))
    if not (d > 0 and math.isfinite(d)):
        raise ValueError(f"{spec.name}: instance sensitivity {d} must be positive and finite")
    return d


__all__ = ["answer_statistics", "clip_l2", "client_sigma", "kind_of", "mechanism_class", "plugin_client",
           "plugin_mechanisms", "release"]  # fmt: skip
