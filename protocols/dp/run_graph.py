"""A run's privacy-loss graph (:class:`protocols.dp.privacy_graph.Graph`) from its privacy settings and the σ, q and
steps of its mechanisms: the one place that says which mechanisms a run declares, its channels and its leaks. The
DP layer builds it from its ledgers (realised steps) and ``validate`` from the plan (planned steps)."""

from __future__ import annotations

from protocols.dp.banded_ledger import ClientBanded
from protocols.dp.mechanism_plugins import active_plugins, plugin_channel
from protocols.dp.mechanisms import (
    CLIENT_TRAINING,
    LABEL_SETS,
    MECHANISMS,
    AdaptiveClipping,
    ClientDPSGD,
    ClientDPSGDShares,
    ClientNoiseShares,
    ClientServerNoise,
    ClientTree,
    DPMechanism,
    LabelSetWStep,
)
from protocols.dp.privacy_graph import Graph, Leak, uncovered_channels
from protocols.dp.released_model import CLIENT_TRAINING_STEP, LABEL_SET_STEP, unnoised_steps

#: the instance unit's mechanisms, as its report names them
SERVER_STEP, CLIENT_STEP = "server_w_step", "client_training"

#: why a channel with no mechanism leaves the released model uncovered (the words of protocols.dp.released_model)
UNNOISED_LABEL_SETS, UNNOISED_TRAINING = LABEL_SET_STEP["why"], CLIENT_TRAINING_STEP["why"]
LOSS_IN_CLEAR = ("each client's update is a function of its noisy DP-SGD steps (batches and noise are the client's "
                 "secrets), but its training loss and example count reach the server in the clear (or, under a secure "
                 "sum, their sums), outside DP-SGD")  # fmt: skip


def mechanism_kind(privacy, name: str) -> str:
    """The registered kind (:data:`protocols.dp.mechanisms.MECHANISMS`) of the mechanism a run with this ``privacy``
    section declares under ``name`` (the instance unit's ``server_w_step`` and ``client_training``; the client unit's
    ``client``; a DP mechanism plugin's ``<name>`` and ``<name>_client``): the one place that maps settings to
    mechanisms."""
    if any(name in (spec.name, f"{spec.name}_client") for spec, _ in active_plugins(privacy)):
        from protocols.dp.plugin_release import kind_of  # registers the plugin's mechanism classes

        return kind_of(name)
    if name == SERVER_STEP:
        return LabelSetWStep.kind
    if name == CLIENT_STEP:
        return (ClientDPSGDShares if privacy.local.noise == "shares" else ClientDPSGD).kind
    c = privacy.client
    if c.mechanism == "tree":
        return ClientTree.kind
    if c.mechanism == "banded":
        return ClientBanded.kind
    if c.adaptive_clipping is not None:
        return AdaptiveClipping.kind
    return (ClientNoiseShares if c.noise == "clients" else ClientServerNoise).kind


def declared_names(privacy) -> list[str]:
    """The mechanisms a run with this ``privacy`` section declares, by name (see :func:`mechanism_kind`)."""
    plugins = [spec.name for spec, _ in active_plugins(privacy)]
    return (
        ([SERVER_STEP] if privacy.instance is not None else [])
        + ([CLIENT_STEP] if privacy.local is not None else [])
        + plugins
        + (["client"] + [f"{name}_client" for name in plugins] if privacy.client is not None else [])
    )


def run_channels(label_set_algorithm: bool, *, statistics: tuple[str, ...] = (), client_training: bool = True,
                 privacy=None) -> dict[str, str]:  # fmt: skip
    """A run's channels, each with why its data reaches a release un-noised when no mechanism covers it: W's
    label-set step where the algorithm collects label sets, client training where its clients train
    (``AlgorithmCapabilities.client_training``), and each statistic released before round 0: the algorithm's
    (``setup_statistics``) and the DP mechanism plugins' that ``privacy`` sets."""
    channels = {LABEL_SETS: UNNOISED_LABEL_SETS} if label_set_algorithm else {}
    if client_training:
        channels[CLIENT_TRAINING] = UNNOISED_TRAINING
    plugins = [spec.statistic for spec, _ in active_plugins(privacy)] if privacy is not None else []
    for stat in dict.fromkeys([*statistics, *plugins]):
        channels[plugin_channel(stat)] = (
            f"the {stat} the algorithm asks the clients for before round 0 are released in the model with no mechanism "
            "on them (set the DP mechanism plugin that releases them, e.g. privacy.label_prior)"
        )
    return channels


def algorithm_channels(privacy, capabilities) -> dict[str, str]:
    """:func:`run_channels` of a run whose algorithm declares ``capabilities``, under this ``privacy`` section."""
    return run_channels(capabilities.collects_label_sets, statistics=tuple(capabilities.setup_statistics),
                        client_training=capabilities.client_training, privacy=privacy)  # fmt: skip


def _channels(privacy, label_set_algorithm: bool, capabilities) -> dict[str, str]:
    if capabilities is not None:
        return algorithm_channels(privacy, capabilities)
    return run_channels(label_set_algorithm, privacy=privacy)


def planned_unnoised_steps(privacy, *, label_set_algorithm: bool = False, capabilities=None) -> list[dict]:
    """The un-noised steps (:func:`protocols.dp.released_model.unnoised_steps`) of a run's plan: the channels its
    declared mechanisms' kinds leave uncovered against the observer, by the graph's rule (no σ needed). The
    algorithm's channels come from its ``capabilities`` where given, else from ``label_set_algorithm``."""
    kinds = [MECHANISMS[mechanism_kind(privacy, name)] for name in declared_names(privacy)]
    return unnoised_steps(uncovered_channels(_channels(privacy, label_set_algorithm, capabilities), kinds, "observer"))


def run_graph(privacy, *, mechanisms: list[DPMechanism], instance_group: int, population: int, cohort: int | None,
              label_set_algorithm: bool = False, capabilities=None) -> Graph:  # fmt: skip
    """The graph of a run whose ``privacy`` section and algorithm (its declared ``capabilities``, or only whether it
    collects label sets) are given, over its declared ``mechanisms`` (each with the steps to account: realised, or
    planned). ``cohort``: a fixed cohort's size, None under Poisson sampling."""
    channels = _channels(privacy, label_set_algorithm, capabilities)
    kinds = {m.kind for m in mechanisms}
    # under DP-SGD each client sends its training loss (and its example count) outside DP-SGD; with noise shares the
    # loss is not sent (local shares: the share step; client shares: noise_share_step sends 0), and the count is 1
    leaks = (
        [Leak(CLIENT_TRAINING, "server", LOSS_IN_CLEAR)]
        if ClientDPSGD.kind in kinds and ClientNoiseShares.kind not in kinds
        else []
    )
    return Graph(list(mechanisms), channels, leaks, instance_group=int(instance_group), population=int(population),
                 cohort=cohort)  # fmt: skip


__all__ = [
    "CLIENT_STEP",
    "SERVER_STEP",
    "algorithm_channels",
    "declared_names",
    "mechanism_kind",
    "planned_unnoised_steps",
    "run_channels",
    "run_graph",
]
