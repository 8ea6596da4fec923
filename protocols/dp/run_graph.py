"""A run's privacy-loss graph (:class:`protocols.dp.privacy_graph.Graph`) from its privacy settings and the σ, q and
steps of its mechanisms: the one place that says which mechanisms a run declares, its channels and its leaks. The
DP layer builds it from its ledgers (realised steps) and ``validate`` from the plan (planned steps)."""

from __future__ import annotations

from protocols.dp.mechanisms import (
    CLIENT_TRAINING,
    LABEL_SETS,
    AdaptiveClipping,
    ClientDPSGD,
    ClientDPSGDShares,
    ClientNoiseShares,
    ClientServerNoise,
    ClientTree,
    DPMechanism,
    LabelSetWStep,
)
from protocols.dp.privacy_graph import Graph, Leak
from protocols.dp.released_model import CLIENT_TRAINING_STEP, LABEL_SET_STEP

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
    if c.adaptive_clipping is not None:
        return AdaptiveClipping.kind
    return (ClientNoiseShares if c.noise == "clients" else ClientServerNoise).kind


def run_graph(privacy, *, label_set_algorithm: bool, mechanisms: list[DPMechanism], instance_group: int, population: int,
              cohort: int | None) -> Graph:  # fmt: skip
    """The graph of a run whose ``privacy`` section and algorithm (whether it collects label sets) are given, over its
    declared ``mechanisms`` (each with the steps to account: realised, or planned). ``cohort``: a fixed cohort's size,
    None under Poisson sampling."""
    channels = {LABEL_SETS: UNNOISED_LABEL_SETS} if label_set_algorithm else {}
    channels[CLIENT_TRAINING] = UNNOISED_TRAINING
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


__all__ = ["CLIENT_STEP", "SERVER_STEP", "mechanism_kind", "run_graph"]
