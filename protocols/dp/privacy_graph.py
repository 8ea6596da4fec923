"""The privacy-loss graph: per unit and adversary, ε is the composition of every declared mechanism whose output
that adversary reaches, each counted once, at the unit's sensitivity.

Inputs: the declared mechanisms (:mod:`protocols.dp.mechanisms`), the run's channels (the paths by which training
data reaches a released tensor) and its *leaks* (values that reach an adversary with no mechanism on them: for
example the clear training loss a client sends under DP-SGD). The rules, the only ones in the code:

1. A channel with a leak towards the adversary, or with no mechanism that protects against it, makes the ε ∞, with
   its one-line why. A mechanism whose noise the adversary adds itself protects nothing against it
   (:func:`protecting`; :func:`uncovered_channels` names the channels left with none, which the privacy report and
   ``validate`` list as un-noised: :mod:`protocols.dp.released_model`).
2. A mechanism covers the unit it is accounted for at group size 1. A client mechanism covers an instance through the
   ``instance_group`` clients it sits on (each substituted: :mod:`protocols.dp.group_bound`). An instance mechanism
   covers no client (unbounded group).
3. Against an adversary that knows a mechanism's sample (the server draws the cohort, or sees who sent), q = 1.
4. Mechanisms on one channel are in series: the channel's RDP is the smallest of theirs at each order (the release
   is a post-processing of each one's output). Channels compose: their RDP curves add.
5. When every channel is covered by exactly one mechanism of the unit itself at group 1, the unit's own accountant
   (any registered one: RDP, PRV, PLD; :mod:`protocols.dp.accountants`) computes the ε of their joint (σ, q, steps)
   history; otherwise the RDP curve above is converted (Opacus's conversion), and the report says ``accountant:
   rdp`` — unless the unit's own mechanisms alone (one per channel) give a smaller ε by its own accountant (PRV or
   PLD), which also bounds the release.

Where the accountants apply: to histories of Poisson-subsampled Gaussian steps (σ, q, steps), which every
mechanism gives for its own unit (:meth:`~protocols.dp.mechanisms.DPMechanism.history`). A curve that is no such
history — a client mechanism's group bound for an instance (:mod:`protocols.dp.group_bound`, an RDP curve only), or
the series minimum of several mechanisms on one channel — is never handed to PRV or PLD: it is composed and
converted by RDP (a valid bound), and the adversary's entry names ``accountant: rdp`` beside the unit's own. No other
accountant is substituted silently.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from protocols.dp.accountant import reported
from protocols.dp.accountants import epsilon_of
from protocols.dp.accountants.rdp import rdp_curve_epsilon
from protocols.dp.mechanisms import CLIENT, INSTANCE, ORDERS, DPMechanism

#: each channel, as a report's sentence names it
CHANNEL_WORDS = {"label_sets": "W's label-set step", "client_training": "client training"}

#: the adversaries the report names: whoever sees the released θ, W and files; the server, which sees the messages
ADVERSARIES = ("observer", "server")


@dataclass(frozen=True)
class Leak:
    """A value that reaches ``adversary`` through ``channel`` with no mechanism on it."""

    channel: str
    adversary: str
    why: str


def protecting(mechanisms: Iterable, channel: str, adversary: str) -> list:
    """The ``mechanisms`` on ``channel`` that protect against ``adversary`` (rule 1): against the observer, every one;
    against the server, those whose noise it does not add itself. Declared mechanisms or their classes (what a
    config declares before σ is known): only ``channel`` and ``noise_by`` are read."""
    return [m for m in mechanisms if m.channel == channel and not (adversary == "server" and m.noise_by == "server")]


def uncovered_channels(channels: Iterable[str], mechanisms: Iterable, adversary: str) -> list[str]:
    """The ``channels``, in their order, on which no mechanism protects against ``adversary`` (:func:`protecting`):
    what reaches it there is un-noised."""
    mechanisms = list(mechanisms)
    return [c for c in channels if not protecting(mechanisms, c, adversary)]


@dataclass
class Graph:
    """A run's declared mechanisms, channels and leaks, and the public facts the group bound needs."""

    mechanisms: list[DPMechanism]
    channels: dict[str, str]  #: channel → why its data reaches a release with no mechanism, when it has none
    leaks: list[Leak] = field(default_factory=list)
    instance_group: int = 1  #: clients one instance sits on (a public bound)
    population: int | None = None  #: the federation's clients (a fixed cohort's hypergeometric law)
    cohort: int | None = None  #: a fixed cohort's size; None under Poisson sampling

    def epsilon(self, unit: str, adversary: str, *, delta: float, accountant: str) -> dict[str, object]:
        """``{"epsilon", "why"}`` (∞) or ``{"epsilon", "composed", "accountant", "notes"}`` for ``unit`` against
        ``adversary`` (the module's rules)."""
        if adversary not in ADVERSARIES:
            raise ValueError(f"unknown adversary {adversary!r}; choose one of {ADVERSARIES}")
        curves, own, own_views, composed, notes = [], [], [], [], []
        for channel, uncovered in self.channels.items():
            leak = next((x for x in self.leaks if x.channel == channel and x.adversary == adversary), None)
            if leak is not None:
                return {"epsilon": "inf", "why": leak.why}
            candidates = protecting(self.mechanisms, channel, adversary)
            usable = [(m, self._curve(m, unit, adversary)) for m in candidates]
            usable = [(m, c) for m, c in usable if c is not None]
            if not usable:
                why = uncovered
                if candidates:  # mechanisms there, but none bounds this unit (an instance step, per client)
                    names = ", ".join(m.name for m in candidates)
                    why = f"{CHANNEL_WORDS.get(channel, channel)} is covered per instance only ({names}): a client holds an unbounded number of instances"  # noqa: E501
                elif adversary == "server" and (on_channel := [m for m in self.mechanisms if m.channel == channel]):
                    first = on_channel[0]
                    why = first.server_why or f"the server adds the noise of {first.name} itself and sees its input"
                return {"epsilon": "inf", "why": why}
            curves.append(np.min(np.stack([c for _, c in usable]), axis=0))
            composed.extend(m.name for m, _ in usable)
            notes.extend(m.server_note for m, _ in usable if adversary == "server" and m.server_note)
            if len(usable) == 1 and usable[0][0].unit == unit:
                own.append(usable[0][0])
            mine = [m for m, _ in usable if m.unit == unit]
            if len(mine) == 1:
                own_views.append(mine[0])
        noiseless = [m.name for m in self.mechanisms if m.name in composed and m.sigma == 0.0 and m.steps > 0]
        if noiseless and any(np.isinf(c).all() for c in curves):  # a channel whose best protection adds no noise
            return {"epsilon": "inf", "why": f"noise_multiplier 0 (the noiseless control) in {', '.join(noiseless)}: "
                    "the released values carry no noise"}  # fmt: skip
        if len(own) == len(self.channels) and own:  # rule 5: the unit's own accountant over its own history
            history = [h for m in own for h in m.history(sample_rate=self._rate(m, adversary))]
            eps = epsilon_of(history, delta, accountant) if history else 0.0
            return {"epsilon": reported(eps), "composed": composed, "accountant": accountant, "notes": notes}
        total = np.sum(np.stack(curves), axis=0) if curves else np.zeros(len(ORDERS))
        eps = rdp_curve_epsilon(total, delta) if np.any(total) else 0.0
        used = "rdp"
        if len(own_views) == len(self.channels) and accountant != "rdp":  # the unit's own mechanisms alone, by its
            # accountant, also bound the release (each channel's release is a post-processing of them): keep the smaller
            history = [h for m in own_views for h in m.history(sample_rate=self._rate(m, adversary))]
            own_eps = epsilon_of(history, delta, accountant)
            if own_eps < eps:
                eps, used = own_eps, accountant
        return {"epsilon": reported(eps), "composed": composed, "accountant": used, "notes": notes}

    def uncovered(self, adversary: str) -> list[str]:
        """The channels on which no declared mechanism protects against ``adversary`` (:func:`uncovered_channels`)."""
        return uncovered_channels(self.channels, self.mechanisms, adversary)

    @staticmethod
    def _rate(m: DPMechanism, adversary: str) -> float:
        return 1.0 if adversary == "server" and m.sample_known_to_server else m.sample_rate

    def _curve(self, m: DPMechanism, unit: str, adversary: str) -> np.ndarray | None:
        """The mechanism's RDP curve for ``unit`` (None: it bounds no such unit); ∞ at every order once a noiseless
        step (σ = 0, the noiseless control) has run."""
        q = self._rate(m, adversary)
        if m.sigma == 0.0 and (m.unit == unit or (m.unit == CLIENT and unit == INSTANCE)):
            return np.full(len(ORDERS), np.inf if m.steps > 0 else 0.0)
        if m.unit == unit:
            return m.rdp(ORDERS, sample_rate=q)
        if m.unit == CLIENT and unit == INSTANCE:
            return m.group_rdp(ORDERS, group=self.instance_group, sample_rate=q, population=self.population,
                               cohort=self.cohort)  # fmt: skip
        return None


def finite(eps: object) -> bool:
    """Whether a reported ε (a number or ``"inf"``) is finite."""
    return isinstance(eps, (int, float)) and math.isfinite(eps)


__all__ = ["ADVERSARIES", "Graph", "Leak", "finite", "protecting", "uncovered_channels"]
