"""A run's privacy-loss graph (:class:`protocols.dp.privacy_graph.Graph`) from its privacy settings and the σ, q and
steps of its mechanisms: the one place that says which mechanisms a run declares, its channels and its leaks. The
DP layer builds it from its ledgers (realised steps) and ``validate`` from the plan (planned steps)."""

from __future__ import annotations

from dataclasses import dataclass

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

#: the instance unit's mechanisms, as its report names them
SERVER_STEP, CLIENT_STEP = "server_w_step", "client_training"

UNNOISED_LABEL_SETS = ("W's label-set step is un-noised (the server's W update reads the clients' label sets in the "
                       "clear; privacy.instance covers it)")  # fmt: skip
UNNOISED_TRAINING = ("client training is un-noised (θ and the class rows are trained without DP-SGD or client-level "
                     "noise; privacy.local or privacy.client covers it)")  # fmt: skip
LOSS_IN_CLEAR = ("each client's update is a function of its noisy DP-SGD steps (batches and noise are the client's "
                 "secrets), but its training loss and example count reach the server in the clear (or, under a secure "
                 "sum, their sums), outside DP-SGD")  # fmt: skip


@dataclass(frozen=True)
class Gaussian:
    """One mechanism's numbers: noise multiplier, sample rate, steps (Gaussian equivalents for the tree)."""

    sigma: float
    sample_rate: float
    steps: int


def run_graph(privacy, *, label_set_algorithm: bool, w_step: Gaussian | None, dp_sgd: Gaussian | None,
              client: Gaussian | None, adaptive: bool, instance_group: int, population: int,
              cohort: int | None) -> Graph:  # fmt: skip
    """The graph of a run whose ``privacy`` section (``privacy.local``, ``privacy.client``) and algorithm (whether it
    collects label sets) are given, with each present mechanism's numbers. ``cohort``: a fixed cohort's size, None
    under Poisson sampling."""
    mechs: list[DPMechanism] = []
    if w_step is not None:
        mechs.append(LabelSetWStep(name=SERVER_STEP, **vars(w_step)))
    shares = privacy.local is not None and privacy.local.noise == "shares"
    if dp_sgd is not None:
        mechs.append((ClientDPSGDShares if shares else ClientDPSGD)(name=CLIENT_STEP, **vars(dp_sgd)))
    if client is not None:
        c = privacy.client
        cls = (ClientTree if c.mechanism == "tree" else AdaptiveClipping if adaptive
               else ClientNoiseShares if c.noise == "clients" else ClientServerNoise)  # fmt: skip
        mechs.append(cls(name="client", **vars(client)))
    channels = {LABEL_SETS: UNNOISED_LABEL_SETS} if label_set_algorithm else {}
    channels[CLIENT_TRAINING] = UNNOISED_TRAINING
    leaks = [Leak(CLIENT_TRAINING, "server", LOSS_IN_CLEAR)] if dp_sgd is not None and not shares else []
    return Graph(mechs, channels, leaks, instance_group=int(instance_group), population=int(population), cohort=cohort)


__all__ = ["CLIENT_STEP", "SERVER_STEP", "Gaussian", "run_graph"]
