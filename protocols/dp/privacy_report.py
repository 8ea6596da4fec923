"""The dp layer's privacy report: each unit's ledger (:meth:`~protocols.dp.accountant.PrivacyUnit.report`) with its
mechanisms' sensitivities, its ε against each adversary from the run's privacy-loss graph (:mod:`protocols.dp.run_graph`),
the un-noised steps (:mod:`protocols.dp.released_model`), the client unit's instance-level ε and adaptive clipping."""

from __future__ import annotations

from typing import Any

from protocols.dp import adaptive_clipping
from protocols.dp.accountant import PrivacyUnit
from protocols.dp.label_set_dpsgd import SENSITIVITY_IN_CLIP_NORMS
from protocols.dp.privacy_graph import ADVERSARIES, Graph
from protocols.dp.privacy_units import local_copies
from protocols.dp.released_model import unnoised_steps
from protocols.dp.run_graph import CLIENT_STEP, SERVER_STEP, run_graph

NOISE_SEED_WARNING = (
    "privacy.noise_seed is set: every noise and sampling draw follows from that number, so the reported ε does not "
    "hold against anyone who knows it (debugging only)"
)


def privacy_graph(layer, *, planned: bool = False) -> Graph:
    """The run's privacy-loss graph (:mod:`protocols.dp.run_graph`) over the dp ``layer``'s units' declared
    mechanisms, at the steps the ledgers hold (``planned``: the steps they plan)."""
    t, n = layer.settings.training, layer.env.num_clients
    mechs = [m.at(m.planned_steps) if planned else m for u in layer.units.values() for m in u.mechanisms.values()]
    return run_graph(
        layer.settings.privacy, capabilities=layer.settings.algorithm.capabilities, mechanisms=mechs,
        instance_group=layer.env.max_clients_per_instance, population=n,
        cohort=None if t.sampling == "poisson" else t.cohort_size(n),
    )  # fmt: skip


def _adversary(units: dict[str, PrivacyUnit], graph: Graph, unit: str, adversary: str) -> dict[str, Any]:
    """One unit's ε against one adversary, from the graph, with why it holds."""
    u = units[unit]
    res = graph.epsilon(unit, adversary, delta=u.delta, accountant=u.accountant_name)
    if "why" in res:
        return {"epsilon": res["epsilon"], "why": res["why"]}
    sees = "sees the released θ, W and files" if adversary == "observer" else "sees every message"
    out = {"epsilon": res["epsilon"], "why": f"{sees}; composes {', '.join(res['composed'])}"}
    if res["accountant"] != u.accountant_name:
        out["accountant"] = res["accountant"]
    if unit == "instance" and "client" in units:
        out["why"] += f" (client-level noise through a group of {graph.instance_group} clients: protocols/dp/group_bound.py)"
    if res["notes"]:
        out["why"] += "; " + "; ".join(res["notes"])
    return out


def _instance_sensitivities(layer, u: PrivacyUnit, rep: dict[str, Any]) -> None:
    """The instance unit's mechanisms' sensitivities, in their entries of ``rep`` (``rep`` itself with one)."""
    if SERVER_STEP in u.mechanisms:
        m = u.mechanism(SERVER_STEP)
        note = "2C: identical instances share one merged label set, so removing one can change a set, not only remove it"
        target = rep["mechanisms"][SERVER_STEP] if "mechanisms" in rep else rep
        target["sensitivity"] = SENSITIVITY_IN_CLIP_NORMS * m.clip_norm
        target["sensitivity_note"] = note
        target["expected_batch_size"] = layer.settings.instance_divisor  # the public divisor
    if CLIENT_STEP in u.mechanisms:
        m = u.mechanism(CLIENT_STEP)
        target = rep["mechanisms"][CLIENT_STEP] if "mechanisms" in rep else rep
        target["sensitivity"] = m.clip_norm
        target["sensitivity_note"] = (
            "C per step: adding or removing the instance adds or removes one clipped per-sample gradient; it "
            f"enters up to {local_copies(layer.settings, layer.env)} clients' training a round, each of those steps counted"
        )
        if layer.settings.privacy.local.copy_clip == "split":
            target["sensitivity_note"] = (
                "C per step: the instance enters up to "
                f"{int(layer.env.max_clients_per_instance)} clients' training a round, each copy's per-sample gradient "
                "clipped to C/√k on its k clients, so its copies move the clients' releases by ≤ C together; one copy's "
                "steps counted"
            )
        if layer.local_shares:
            target["sensitivity_note"] = (
                "C per round: adding or removing the instance adds or removes one clipped per-sample gradient in "
                "its one client's gradient sum, hence in the round's secure sum, whose noise (the clients' shares, "
                "≥ t of them) is σ(C + γ√d); against the server this holds only with the secure sum"
            )


def _client_extras(layer, u: PrivacyUnit, graph: Graph, rep: dict[str, Any]) -> None:
    """The client unit's weight-capped sensitivity, its instance-level ε (the group bound alone) and adaptive clipping."""
    client = layer.settings.privacy.client
    if client.weight_cap is not None:
        rep["sensitivity"] = u.clip_norm
        rep["sensitivity_note"] = (
            f"each client's update is clipped to C, then scaled by min(w, W̄)/W̄ ≤ 1 with its eq. 2 weight w and "
            f"the public cap W̄ = {client.weight_cap:g}; it reports weight 1, so w is released "
            "only inside the noised sum"
        )
    k = int(layer.env.max_clients_per_instance)
    alone = Graph([m for m in graph.mechanisms if m.unit == "client"], {"client_training": ""},
                  instance_group=k, population=graph.population, cohort=graph.cohort)  # fmt: skip
    rep["instance_level"] = {
        "group_size": k,
        "epsilon": alone.epsilon("instance", "observer", delta=u.delta, accountant=u.accountant_name)["epsilon"],
        "delta": u.delta,
        "note": f"one training instance sits on up to {k} clients (a public bound: in the positive-only "
                "setting privacy.client.max_labels_per_instance, else the number of labels; 1 in a partition "
                "that puts each instance on one client); removing it substitutes each of those clients' "
                "updates (a shift of at most 2C each, when sampled): the group bound of "
                "protocols/dp/group_bound.py, the client-level mechanism alone",
    }  # fmt: skip
    if layer.adaptive is not None:
        clip, update_sigma = layer.adaptive
        rep["adaptive_clipping"] = adaptive_clipping.released(clip, sigma=u.sigma, update_sigma=update_sigma)


def privacy_report(layer) -> dict[str, Any]:
    """Each unit's report. ``unnoised`` (in every unit's, the same list) names the steps that shape a released
    tensor with no DP mechanism of this stack on them: with one, no unit's ε bounds what the released θ and W
    reveal (the observer's ε is ∞, and so is the run's top-level ε)."""
    graph = layer.privacy_graph()
    unnoised = unnoised_steps(graph.uncovered("observer"))
    out = {}
    for name, u in layer.units.items():
        rep = u.report()
        rep["unnoised"] = [dict(x) for x in unnoised]
        if name == "instance":
            _instance_sensitivities(layer, u, rep)
        if (bound := layer.settings.privacy.max_labels_per_instance()) is not None and name in ("instance", "client"):
            rep["contribution_bound"] = {"max_labels_per_instance": bound, "over_bound": layer.settings.privacy.over_bound}
        rep["adversaries"] = {adv: _adversary(layer.units, graph, name, adv) for adv in ADVERSARIES}
        if unnoised:  # the same verdict as the graph's, with every un-noised step named
            rep["adversaries"]["observer"] = {"epsilon": "inf", "why": "; ".join(x["why"] for x in unnoised)}
        if name == "client":
            _client_extras(layer, u, graph, rep)
        if layer.server_stream.derived_from_seed:
            rep["warning"] = NOISE_SEED_WARNING
        out[name] = rep
    if getattr(layer, "pretrain_stopped", None):
        out["instance"]["stopped"] = layer.pretrain_stopped
    return out


__all__ = ["NOISE_SEED_WARNING", "privacy_graph", "privacy_report"]
