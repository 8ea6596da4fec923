"""The DP mechanisms of a run, declared: what each releases, which unit its (σ, q) is accounted for, who adds its
noise, who knows its sample, and its privacy curve for its own unit or for a group of those units.

A mechanism is a registered class (:data:`MECHANISMS`, :func:`register_mechanism`); the DP layer declares one
instance per mechanism it runs, with its σ, q and steps (realised or planned), and :mod:`protocols.dp.privacy_graph`
composes, per unit and adversary, every declared mechanism whose output that adversary reaches. Nothing else in
the code composes ε across mechanisms.

Units: ``instance`` (add/remove one training instance) and ``client`` (add/remove one client). A mechanism covers its
own unit at its accounted sensitivity (group 1). A *client* mechanism covers an instance through the clients that
instance sits on: each of them is substituted, which :mod:`protocols.dp.group_bound` bounds. An *instance* mechanism
does not cover a client (a client holds an unbounded number of instances): the graph gives ∞ there.

Channels: the paths by which training data reaches a released tensor. ``label_sets`` (the server's W update over the
clients' label sets, released in W) and ``client_training`` (θ and the class rows, trained by the clients). Mechanisms
on the same channel are in series (DP-SGD inside client training, then client-level noise on the update): the
channel's release is a post-processing of each one's output, so its RDP is at most each one's, at every order.
"""

from __future__ import annotations

import copy
from typing import ClassVar

import numpy as np

from protocols.dp.discrete_gaussian_accounting import LEDGER_ORDERS, discrete_gaussian_subsampled_rdp
from protocols.dp.group_bound import cohort_count_logpmf, gaussian_rdp, group_substitution_rdp, substitution_sensitivity
from protocols.dp.tree_counts import gaussian_equivalents
from secure_fed.plugin_api.layers import declare_mechanism

#: the Rényi orders of the RDP ledger (:data:`protocols.dp.discrete_gaussian_accounting.LEDGER_ORDERS`: Opacus's
#: defaults 1.1 … 63 and larger ones up to 8192; the subsampled Gaussian's curve there is proven for the discrete one)
RDP_ORDERS = LEDGER_ORDERS

#: the Rényi orders every declared curve is evaluated at: the ledger's, so a unit's own curve is its ledger's
ORDERS = RDP_ORDERS

#: the two channels by which training data reaches a released tensor
LABEL_SETS, CLIENT_TRAINING = "label_sets", "client_training"
#: the units
INSTANCE, CLIENT = "instance", "client"

#: kind → class; :func:`register_mechanism` fills it
MECHANISMS: dict[str, type[DPMechanism]] = {}


def run_mechanisms() -> set[str]:
    """The registered kinds a run's privacy graph composes (``level = "run"``; private selection composes runs)."""
    return {k for k, cls in MECHANISMS.items() if cls.level == "run"}


def builtin_run_mechanisms() -> set[str]:
    """:func:`run_mechanisms` less the DP mechanism plugins' (``plugin`` set: :mod:`protocols.dp.plugin_release`),
    which their own tests check."""
    return {k for k in run_mechanisms() if not MECHANISMS[k].plugin}


def register_mechanism(cls: type[DPMechanism]) -> type[DPMechanism]:
    """Register a mechanism class under its ``kind`` (a class decorator)."""
    if not getattr(cls, "kind", None):
        raise ValueError(f"{cls.__name__} declares no kind")
    if cls.level not in ("run", "study"):
        raise ValueError(f"{cls.__name__}: level must be run or study, not {cls.level!r}")
    if cls.kind in MECHANISMS and MECHANISMS[cls.kind] is not cls:
        raise ValueError(f"a mechanism of kind {cls.kind!r} is already registered ({MECHANISMS[cls.kind].__name__})")
    MECHANISMS[cls.kind] = cls
    declare_mechanism(cls.kind)  # a released value may be tagged protected by it (secure_fed.release)
    return cls


class DPMechanism:
    """One declared mechanism: a subsampled Gaussian of noise multiplier σ (its accounted sensitivity's multiple),
    sample rate q, over ``steps`` steps.

    Class attributes (the declaration): ``kind``; ``unit`` its (σ, q) is accounted for; ``channel``; ``releases``
    (the released tensors it shapes); ``noise_by`` (``server`` or ``clients``: noise the server adds itself protects
    nothing against the server); ``sample_known_to_server`` (the server draws or sees the sample: no amplification
    against it)."""

    kind: ClassVar[str] = ""
    unit: ClassVar[str] = INSTANCE
    channel: ClassVar[str] = CLIENT_TRAINING
    releases: ClassVar[tuple[str, ...]] = ()
    noise_by: ClassVar[str] = "server"
    sample_known_to_server: ClassVar[bool] = True
    #: why it protects nothing against the server (its noise is the server's own), as the report says it
    server_why: ClassVar[str] = ""
    #: the condition under which it holds against the server, where it does
    server_note: ClassVar[str] = ""
    #: whether σ = 0 (the noiseless control: ε = ∞) is defined for it; not where the noise or a count scales with σ
    allows_noiseless: ClassVar[bool] = True
    #: ``run``: one run's privacy graph composes it; ``study``: it composes whole runs (private selection)
    level: ClassVar[str] = "run"
    #: the DP mechanism plugin that declares it (:mod:`protocols.dp.mechanism_plugins`), or "" for a built-in
    plugin: ClassVar[str] = ""

    def __init__(self, *, name: str, sigma: float, sample_rate: float, steps: int = 0, planned_steps: int = 0,
                 scope: str = "", clip_norm: float = 1.0, calibrated: bool = False):  # fmt: skip
        if sigma == 0.0 and not self.allows_noiseless:
            raise ValueError(f"{self.kind or 'mechanism'} {name!r}: σ 0 (the noiseless control) is not defined for it")
        if not (sigma >= 0.0 and 0.0 < sample_rate <= 1.0 and steps >= 0):  # σ = 0: the noiseless control
            raise ValueError(f"{self.kind or 'mechanism'} {name!r}: σ {sigma}, q {sample_rate}, steps {steps} out of range")
        self.name, self.scope = name, scope
        self.sigma, self.sample_rate, self.clip_norm = float(sigma), float(sample_rate), float(clip_norm)
        self.calibrated = bool(calibrated)
        self.planned_steps, self.steps = int(planned_steps), int(steps)  #: the ledger's: steps it plans, steps it holds

    def at(self, steps: int) -> DPMechanism:
        """A copy that has run ``steps`` steps (the graph of a plan: ``at(planned_steps)``)."""
        out = copy.copy(self)
        out.steps = int(steps)
        return out

    def gaussian_steps(self, steps: int) -> int:
        """The subsampled-Gaussian steps an accountant composes for ``steps`` of this mechanism's steps."""
        return int(steps)

    def history(self, *, sample_rate: float | None = None) -> list[tuple[float, float, int]]:
        """The (σ, q, steps) entries an Opacus accountant composes for this mechanism's own unit."""
        n = self.gaussian_steps(self.steps)
        return [(self.sigma, self.sample_rate if sample_rate is None else sample_rate, n)] if n else []

    def rdp(self, orders=ORDERS, *, sample_rate: float | None = None) -> np.ndarray:
        """Its own unit's RDP curve over its steps (add/remove at the accounted sensitivity)."""
        q = self.sample_rate if sample_rate is None else sample_rate
        n = self.gaussian_steps(self.steps)
        if not n:
            return np.zeros(len(orders))
        return n * discrete_gaussian_subsampled_rdp(self.sigma, q, orders)

    def report(self) -> dict[str, object]:
        """The ledger's numbers for this mechanism, as a unit's report lists them."""
        return {
            "scope": self.scope, "noise_multiplier": self.sigma, "sample_rate": self.sample_rate,
            "clip_norm": self.clip_norm, "steps": self.steps, "planned_steps": self.planned_steps,
            "sigma_calibrated": self.calibrated,
        }  # fmt: skip

    def group_rdp(self, orders=ORDERS, *, group: int, sample_rate: float | None = None, population: int | None = None,
                  cohort: int | None = None) -> np.ndarray:  # fmt: skip
        """The RDP curve for one unit of the next finer kind that sits on ``group`` of this mechanism's units, each
        substituted (:mod:`protocols.dp.group_bound`); only client mechanisms have one."""
        raise NotImplementedError(f"{self.kind} is accounted per {self.unit}; it covers no finer unit through a group")

    def declaration(self) -> dict[str, object]:
        """The declaration, as the privacy report names it."""
        return {"kind": self.kind, "unit": self.unit, "channel": self.channel, "releases": list(self.releases),
                "noise_by": self.noise_by, "noise_multiplier": self.sigma, "sample_rate": self.sample_rate,
                "steps": self.steps}  # fmt: skip


@register_mechanism
class LabelSetWStep(DPMechanism):
    """The server's W update over label sets (eq. 11/12), DP-SGD over Poisson-sampled label sets at sensitivity 2C
    (:mod:`protocols.dp.label_set_dpsgd`); the server samples and noises."""

    kind, unit, channel, releases = "w_step", INSTANCE, LABEL_SETS, ("W",)
    noise_by, sample_known_to_server = "server", True
    server_why = "the server holds the label sets it collected and adds the noise itself"


@register_mechanism
class ClientDPSGD(DPMechanism):
    """DP-SGD in client training (``privacy.local``): per-sample clip C, noise σC from the client's secret, Poisson
    batches from the client's secret; each copy of an instance on another client counted as its own steps."""

    kind, unit, channel, releases = "dp_sgd", INSTANCE, CLIENT_TRAINING, ("theta", "rows")
    noise_by, sample_known_to_server = "clients", False


@register_mechanism
class ClientDPSGDShares(ClientDPSGD):
    """Distributed DP-FedSGD (``privacy.local.noise: shares``): one clipped full step a round, each client's
    discrete-Gaussian share inside the secure sum, whose total is the accounted σ(C + γ√d)."""

    kind = "dp_sgd_shares"
    server_note = ("only with the secure sum: noise shares of std σ(C + γ√d)/√t under secure aggregation, whose sum over "
                   "≥ t survivors carries the accounted noise (one client's own sum is only lightly noised); batches are "
                   "sampled from each client's secret and the loss is not sent")  # fmt: skip


class _ClientGaussian(DPMechanism):
    """Client-level DP-FedAvg: each sampled client's update clipped to C, Gaussian noise σC on the sum."""

    unit, channel, releases = CLIENT, CLIENT_TRAINING, ("theta", "rows")
    server_why = "the server sees each clipped update before it adds the noise"

    def group_rdp(self, orders=ORDERS, *, group: int, sample_rate: float | None = None, population: int | None = None,
                  cohort: int | None = None) -> np.ndarray:  # fmt: skip
        q = self.sample_rate if sample_rate is None else sample_rate
        logpmf = cohort_count_logpmf(group, sample_rate=q, population=population, cohort=None if q >= 1.0 else cohort)
        return self.gaussian_steps(self.steps) * group_substitution_rdp(self.sigma, logpmf, orders)


@register_mechanism
class ClientServerNoise(_ClientGaussian):
    """``privacy.client`` with ``noise: server``: the server samples the cohort and adds the noise."""

    kind, noise_by, sample_known_to_server = "client_server_noise", "server", True


@register_mechanism
class ClientNoiseShares(_ClientGaussian):
    """``privacy.client`` with ``noise: clients``: each client's share σC/√t inside the secure sum; the server knows
    who sent an update, so no amplification by sampling against it."""

    kind, noise_by, sample_known_to_server = "client_noise_shares", "clients", True
    server_note = "noise shares under a secure sum; the server knows the cohort, so q = 1"


@register_mechanism
class AdaptiveClipping(ClientServerNoise):
    """``privacy.client.adaptive_clipping``: the clipped sum with noise σ_Δ·C_t and the centred clip bits' count with
    noise σ_b, one Gaussian of multiplier σ together (Andrew et al. 2021, Theorem 1); C_t is released."""

    kind, releases = "adaptive_clipping", ("theta", "rows", "clip_norm")
    allows_noiseless = False  # σ_Δ = (σ^-2 − (2σ_b)^-2)^-1/2 is undefined at σ = 0


@register_mechanism
class ClientTree(_ClientGaussian):
    """DP-FTRL (``privacy.client.mechanism: tree``): every client in every round; the run is one Gaussian of
    multiplier σ/√K, held as K steps at (σ, q = 1) (:mod:`protocols.dp.tree_ledger`)."""

    kind, noise_by, sample_known_to_server = "client_tree", "server", True
    allows_noiseless = False  # its ledger is one Gaussian at σ/√K

    def __init__(self, *, tree_rounds: int, **kw):
        self.tree_rounds = int(tree_rounds)  #: rounds a tree covers before it restarts
        super().__init__(**kw)

    def gaussian_steps(self, steps: int) -> int:
        """K: the Gaussian equivalents of ``steps`` rounds (:func:`protocols.dp.tree_counts.gaussian_equivalents`)."""
        return gaussian_equivalents(steps, self.tree_rounds)

    def group_rdp(self, orders=ORDERS, *, group: int, sample_rate: float | None = None, population: int | None = None,
                  cohort: int | None = None) -> np.ndarray:  # fmt: skip
        return self.gaussian_steps(self.steps) * gaussian_rdp(substitution_sensitivity(group) / self.sigma, orders)


__all__ = [
    "CLIENT", "CLIENT_TRAINING", "INSTANCE", "LABEL_SETS", "MECHANISMS", "ORDERS", "AdaptiveClipping", "ClientDPSGD",
    "ClientDPSGDShares", "ClientNoiseShares", "ClientServerNoise", "ClientTree", "DPMechanism", "LabelSetWStep",
    "builtin_run_mechanisms", "register_mechanism",
]  # fmt: skip
