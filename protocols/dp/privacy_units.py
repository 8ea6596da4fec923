"""The dp layer's privacy units, built once from its settings and the run's public facts (its plan): the instance
unit (the W step over label sets and DP-SGD in client training, one ledger), the client unit (client-level noise, or
DP-FTRL's tree), and the build-time checks of their σ against secure aggregation's encoding."""

from __future__ import annotations

from typing import Any

from protocols.dp.accountant import PrivacyUnit, calibrate_shared_sigma, calibrate_sigma
from protocols.dp.banded_ledger import banded_client_unit
from protocols.dp.local_dpsgd import copies_per_round, local_steps_per_round
from protocols.dp.mechanism_plugins import active_plugins
from protocols.dp.run_graph import CLIENT_STEP, SERVER_STEP, mechanism_kind
from protocols.dp.tree_ledger import tree_client_unit
from protocols.layer_settings import DPSettings
from protocols.layer_specs import share_range_error
from secure_fed.plugin_api.layers import ConfigError, StackEnv

#: the client unit's scope, as its report names it
CLIENT_SCOPE = "each client's whole update of θ and its class rows"


def local_copies(settings: DPSettings, env: StackEnv) -> int:
    """The copies of one instance the ledger counts in each DP-SGD step: the client trainings it can enter per round
    (``k``: in the positive-only setting the public bound ``max_labels_per_instance``, which every instance is bounded
    to before the partition; 1 in a CMDA/iid partition), capped by the largest cohort a round can have (all clients
    under Poisson sampling, else the fixed cohort size: ⌈fN⌉ or ``training.clients_per_round``); the ledger counts
    this worst case every round, whatever the realised cohort. With ``privacy.local.copy_clip: split``, 1: each of
    the k copies is clipped to C/√k, so in every step (q = 1) its k releases, each noised by its own client, are k
    Gaussians of sensitivity C/√k whose RDP adds up to one Gaussian's at sensitivity C (k·α/(2σ²k))."""
    t = settings.training
    loc = settings.privacy.local
    if loc is not None and loc.copy_clip == "split":
        if loc.batch_sample_rate < 1.0 or loc.noise != "local":  # validation refuses it first; never count it as one
            raise ConfigError("privacy.local.copy_clip: split needs batch_sample_rate 1 and noise: local")
        return 1
    n = env.num_clients
    largest = n if t.sampling == "poisson" else t.cohort_size(n)
    return copies_per_round(env.max_clients_per_instance, largest)


def client_training_steps(settings: DPSettings, env: StackEnv) -> int:
    """Steps of the ``client_training`` mechanism the instance unit records per round."""
    q = settings.privacy.local.batch_sample_rate
    return local_copies(settings, env) * local_steps_per_round(local_epochs=settings.training.local_epochs, sample_rate=q)


def fixed_parts(settings: DPSettings) -> list[str]:
    """The released tensors that no mechanism needs to cover: they do not depend on the training data."""
    if not settings.fixed_encoder:
        return []
    return ["θ's encoder g_θ: fixed at its initialisation from the run's seed (model.fixed_encoder), never "
            "trained, so the released value does not depend on the data (covered at no cost)"]  # fmt: skip


def _trained_in_clients(settings: DPSettings, env: StackEnv) -> str:
    """What client training changes, as the report names it."""
    if not settings.fixed_encoder:
        return "θ and the client's class rows" if env.has_rows else "θ"
    return "the client's class rows" if env.has_rows else "θ's linear head"


def _instance_mechanisms(settings: DPSettings, env: StackEnv) -> list[dict[str, Any]]:
    """The instance unit's mechanisms, as the settings declare them: name, settings block, q, planned steps, scope."""
    p = settings.privacy
    fixed = settings.algorithm.capabilities.fixed_w
    mechs: list[dict[str, Any]] = []
    if p.instance is not None:
        mechs.append({
            "name": SERVER_STEP, "block": p.instance, "sample_rate": p.instance.sample_rate,
            "planned_steps": settings.algorithm.private_w_steps(settings.training.rounds),
            "scope": "their label sets in the server's W update (eq. 12 pre-training)" if fixed
            else "their label sets in the server's W update (eq. 11 with σ weights, eq. 9)",
        })  # fmt: skip
    if p.local is not None:
        k = int(env.max_clients_per_instance)
        trained = _trained_in_clients(settings, env)
        mechs.append({
            "name": CLIENT_STEP, "block": p.local, "sample_rate": p.local.batch_sample_rate,
            "planned_steps": settings.training.rounds * client_training_steps(settings, env),
            "scope": f"DP-SGD in client training ({trained}), per-sample clipping; one instance "
                     f"enters up to {local_copies(settings, env)} clients' training a round (it sits on ≤ {k} clients), "
                     "each of their steps counted",
        })  # fmt: skip
        if p.local.copy_clip == "split":
            mechs[-1]["scope"] = (
                f"DP-SGD in client training ({trained}), per-sample clipping with the clip split over an instance's "
                f"copies: on k ≤ {k} clients each copy is clipped to C/√k, so its copies count as one copy's steps"
            )
        if p.local.noise == "shares":
            mechs[-1]["scope"] = (
                f"distributed DP-FedSGD in client training ({trained}): per-sample clipping, one "
                "step a round, each client's discrete Gaussian noise share σ(C + γ√d)/√t on its clipped gradient sum, "
                "summed by secure aggregation over ≥ t survivors; one instance on one client"
            )
    if active_plugins(p):  # the DP mechanism plugins' releases, charged to this unit's ledger
        from protocols.dp.plugin_release import plugin_mechanisms

        mechs.extend(plugin_mechanisms(p, with_client=p.client is not None))
    return mechs


def _instance_not_covered(settings: DPSettings) -> list[str]:
    """What the instance unit's ledger does not cover, as its report says."""
    p = settings.privacy
    not_covered = ["which labels have a training instance (the label space, and in the positive-only setting the set "
                   "of clients): public, it decides W's shape"]  # fmt: skip
    if p.local is None and settings.algorithm.capabilities.client_training:
        not_covered.append(
            "client training on the instance (θ and class-row updates): "
            + ("outside this unit's ledger: the observer's ε composes the client unit's noise through the group of "
               "clients an instance sits on (units.client.instance_level)" if p.client is not None
               else "add privacy.local to cover it")
        )  # fmt: skip
    if p.instance is None and settings.label_set_algorithm:
        not_covered.append("label-set collection for the server's W update: add privacy.instance to cover it")
    return not_covered


def _block(name: str) -> str:
    """The ``privacy.<block>`` a mechanism of the instance unit is set in."""
    return {SERVER_STEP: "instance", CLIENT_STEP: "local"}.get(name, name)


def instance_unit(settings: DPSettings, env: StackEnv) -> PrivacyUnit:
    """The instance unit: one ledger over the W step and DP-SGD in client training, a free σ calibrated to the one
    target over both; refused where the first round alone would pass that target."""
    p = settings.privacy
    mechs = _instance_mechanisms(settings, env)
    target = next((m["block"].target_epsilon for m in mechs if m["block"].target_epsilon is not None), None)
    free = [m for m in mechs if m["block"].noise_multiplier is None]
    if free and target is None:
        raise ValueError(f"privacy.{_block(free[0]['name'])}: give noise_multiplier or target_epsilon")
    shared = None
    # the target's block
    block = next((_block(m["name"]) for m in mechs if m["block"].target_epsilon is not None), _block(mechs[0]["name"]))
    if free:
        try:
            shared = calibrate_shared_sigma(
                target_epsilon=target, delta=p.delta, accountant=p.accountant,
                parts=[(m["sample_rate"], m["planned_steps"], m["block"].noise_multiplier) for m in mechs],
            )  # fmt: skip
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"privacy.{block}.target_epsilon: {exc}") from None
    not_covered = _instance_not_covered(settings)
    unit = None
    for m in mechs:
        sigma = m["block"].noise_multiplier if m["block"].noise_multiplier is not None else shared
        kw = {"scope": m["scope"], "sigma": sigma, "sample_rate": m["sample_rate"],
              "clip_norm": m.get("clip_norm", getattr(m["block"], "clip_norm", None)),
              "calibrated": m["block"].noise_multiplier is None, "planned_steps": m["planned_steps"],
              "kind": mechanism_kind(p, m["name"])}  # fmt: skip
        if unit is None:
            unit = PrivacyUnit(
                name="instance", delta=p.delta, accountant=p.accountant, target_epsilon=target,
                not_covered=not_covered, report_gdp=p.report_gdp, mechanism=m["name"], **kw,
            )  # fmt: skip
            unit.scope = "training instances, through " + " and ".join(x["scope"] for x in mechs)
        else:
            unit.add_mechanism(m["name"], **kw)
    first = {m["name"]: (client_training_steps(settings, env) if m["name"] == CLIENT_STEP else 1) for m in mechs}
    if (why := unit.stop_reason(plan=first)) is not None:
        raise ConfigError(
            f"privacy.{block}.target_epsilon {target:g} cannot be met: the first round alone would exceed it "
            f"({why.split(': ', 1)[1].split('; stopped')[0]}); raise the noise_multiplier, or omit it to calibrate σ"
        )
    return unit


def client_unit(settings: DPSettings, env: StackEnv) -> PrivacyUnit:
    """The client unit: client-level noise over the rounds at the client fraction q, σ given or calibrated; under
    ``mechanism: tree`` DP-FTRL's (:mod:`protocols.dp.tree_ledger`)."""
    p = settings.privacy
    not_cov = []
    if settings.label_set_algorithm:
        not_cov.append("label-set collection: a client's tokens shape W through the server regulariser "
                       "(covered per instance by privacy.instance, not per client)")  # fmt: skip
    if p.client.mechanism == "banded":
        try:
            return banded_client_unit(client=p.client, training=settings.training, delta=p.delta, accountant=p.accountant,
                                      scope=CLIENT_SCOPE, not_covered=not_cov, report_gdp=p.report_gdp)  # fmt: skip
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"privacy.client: {exc}") from None
    if p.client.mechanism == "tree":
        try:
            return tree_client_unit(client=p.client, delta=p.delta, accountant=p.accountant, rounds=settings.training.rounds,
                                    scope=CLIENT_SCOPE, not_covered=not_cov, report_gdp=p.report_gdp)  # fmt: skip
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"privacy.client.target_epsilon: {exc}") from None
    client, q, steps = p.client, settings.training.client_fraction, settings.training.rounds
    calibrated = client.noise_multiplier is None
    if calibrated:
        if client.target_epsilon is None:
            raise ValueError("privacy.client: give noise_multiplier or target_epsilon")
        try:
            sigma = calibrate_sigma(
                target_epsilon=client.target_epsilon, delta=p.delta, sample_rate=q, steps=steps, accountant=p.accountant
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"privacy.client.target_epsilon: {exc}") from None
    else:
        sigma = client.noise_multiplier
    return PrivacyUnit(
        name="client", scope=CLIENT_SCOPE, sigma=sigma, sample_rate=q, delta=p.delta, accountant=p.accountant,
        target_epsilon=client.target_epsilon, clip_norm=client.clip_norm, calibrated=calibrated, planned_steps=steps,
        not_covered=not_cov, report_gdp=p.report_gdp, kind=mechanism_kind(p, "client"),
    )  # fmt: skip


def add_plugin_client_mechanisms(settings: DPSettings, units: dict[str, PrivacyUnit]) -> None:
    """With ``privacy.client``, each DP mechanism plugin's release declared in the client unit too: the same noise,
    at the client sensitivity (:func:`protocols.dp.plugin_release.client_sigma`)."""
    client = units.get("client")
    if client is None:
        return
    from protocols.dp.plugin_release import client_sigma

    for spec, section in active_plugins(settings.privacy):
        sigma = client_sigma(spec, section, units["instance"].mechanism(spec.name).sigma)
        client.add_mechanism(
            f"{spec.name}_client", kind=mechanism_kind(settings.privacy, f"{spec.name}_client"), sigma=sigma,
            sample_rate=1.0, clip_norm=spec.client_clip(section), calibrated=False, planned_steps=1,
            scope=f"the client's clipped share of the released {spec.statistic} ({spec.name})",
        )  # fmt: skip


def _update_dim(env: StackEnv) -> int | None:
    """The update's coordinates (θ and the row table, as secure aggregation packs them), None without θ."""
    layout = env.update_layout()
    return sum(s.stop - s.start for s in layout.segments().values()) if env.theta else None


def check_share_range(settings: DPSettings, env: StackEnv, sigma: float) -> None:
    """Noise shares must pass secure aggregation's encoding unclipped (:func:`protocols.layer_specs.share_range_error`);
    checked here, with σ as calibrated (``validate`` checks a given σ before the run)."""
    if why := share_range_error(settings.privacy.client, settings.encoding, sigma, _update_dim(env)):
        raise ConfigError(why)


def check_local_shares(settings: DPSettings, env: StackEnv, sigma: float) -> None:
    """One copy of an instance per round (the one sum holds every copy: k copies would be sensitivity kC), and
    shares that pass secure aggregation's encoding unclipped at the calibrated σ."""
    if (k := local_copies(settings, env)) != 1:
        raise ConfigError(
            f"privacy.local.noise: shares: an instance enters up to {k} clients' training a round, and all of them "
            f"enter the one noised sum (sensitivity {k}C): use a partition with each instance on one client "
            "(privacy.local.max_labels_per_instance: 1 on positive_only) or noise: local"
        )
    if why := share_range_error(settings.privacy.local, settings.encoding, sigma, _update_dim(env)):
        raise ConfigError(why)


__all__ = ["add_plugin_client_mechanisms", "check_local_shares", "check_share_range", "client_training_steps",
           "client_unit", "fixed_parts", "instance_unit", "local_copies"]  # fmt: skip
