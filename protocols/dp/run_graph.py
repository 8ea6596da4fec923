"""A run's privacy-loss graph (:class:`protocols.dp.privacy_graph.Graph`) from its privacy settings and the σ, q and
steps of its mechanisms: the one place that says which mechanisms a run declares, its channels and its leaks. The
DP layer builds it from its ledgers (realised steps) and ``validate`` from the plan (planned steps)."""

from __future__ import annotations

from protocols.dp.banded_ledger import ClientBanded
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
    ``client``): the one place that maps settings to mechanisms."""
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
    return (
        ([SERVER_STEP] if privacy.instance is not None else [])
        + ([CLIENT_STEP] if privacy.local is not None else [])
        + (["client"] if privacy.client is not None else [])
    )


def run_channels(label_set_algorithm: bool) -> dict[str, str]:
    """A run's channels, each with why its data reaches a release un-noised when no mechanism covers it: W's
    label-set step where the algorithm collects label sets, and client training."""
    channels = {LABEL_SETS: UNNOISED_LABEL_SETS} if label_set_algorithm else {}
    channels[CLIENT_TRAINING] = UNNOISED_TRAINING
    return channels


def planned_unnoised_steps(privacy, *, label_set_algorithm: bool) -> list[dict]:
    """The un-noised steps (:func:`protocols.dp.released_model.unnoised_steps`) of a run's plan: the channels its
    declared mechanisms' kinds leave uncovered against the observer, by the graph's rule (no σ needed)."""
    kinds = [MECHANISMS[mechanism_kind(privacy, name)] for name in declared_names(privacy)]
    return unnoised_steps(uncovered_channels(run_channels(label_set_algorithm), kinds, "observer"))


def run_graph(privacy, *, label_set_algorithm: bool, mechanisms: list[DPMechanism], instance_group: int, population: int,
              cohort: int | None) -> Graph:  # fmt: skip
    """The graph of a run whose ``privacy`` section and algorithm (whether it collects label sets) are given, over its
    declared ``mechanisms`` (each with the steps to account: realised, or planned). ``cohort``: a fixed cohort's size,
    None under Poisson sampling."""
    channels = run_channels(label_set_algorithm)
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
    "declared_names",
    "mechanism_kind",
    "planned_unnoised_steps",
    "run_channels",
    "run_graph",
]
