"""Roles, the attack interface and what an attack returns.

An attack is split in three so that it cannot read what its role does not see:

* :meth:`Attack.prepare` runs in the *simulator*. It builds the attacker's
  auxiliary knowledge (``aux``: public data, a candidate pool, canary secrets
  the auditor chose) and, separately, the ground truth used only for scoring.
* :meth:`Attack.run` is the attacker. It receives its role's view
  (:mod:`threat_models.views`) and ``aux``, nothing else, and returns a guess.
* :meth:`Attack.score` compares the guess with the ground truth and reports
  each metric beside its chance level.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import numpy as np

from secure_fed.plugin_api.attacks import AttackSpec


class Role(str, Enum):
    """Who attacks."""

    SERVER = "server"  #: honest-but-curious server: follows the protocol, keeps everything it receives
    CLIENT = "client"  #: a malicious client: its own data and the downlinks it receives
    OBSERVER = "observer"  #: anyone holding the released model (θ, W) and the public configuration
    AUDITOR = "auditor"  #: the experimenter who inserted canaries and sees the released model


@dataclass
class AttackResult:
    """One attack on one run. ``metrics`` and ``chance`` share keys where a chance level exists."""

    attack: str
    role: str
    metrics: dict[str, Any]
    chance: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"role": self.role, "metrics": self.metrics, "chance": self.chance, "details": self.details}
        if self.skipped:
            out["skipped"] = self.skipped
        return out


class Attack(ABC):
    """The interface every attack implements (see the module docstring)."""

    #: the attack's registered spec (:mod:`threat_models.attack_specs`): the one place its metadata is written
    spec: ClassVar[AttackSpec]
    name: ClassVar[str]
    role: ClassVar[Role]
    #: what the attacker needs beyond its view, in words (``secure-fed list``)
    needs: ClassVar[str]
    #: which protocol layer is meant to defeat it
    defended_by: ClassVar[str]
    description: ClassVar[str]

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            cls.name, cls.role, cls.needs = spec.name, Role(spec.role), spec.needs
            cls.defended_by, cls.description = spec.defended_by, spec.description

    def __init__(self, options: Any = None):
        self.options = options

    def applies(self, ctx) -> str | None:
        """``None`` if the attack applies to this run, else why not (reported as ``skipped``)."""
        return None

    @abstractmethod
    def prepare(self, ctx) -> tuple[Any, Any]:
        """Simulator side: ``(aux, truth)``. ``aux`` goes to the attacker, ``truth`` only to :meth:`score`."""

    @abstractmethod
    def run(self, view, aux) -> Any:
        """Attacker side: a guess from the role's view and the auxiliary knowledge only."""

    @abstractmethod
    def score(self, guess, truth) -> AttackResult:
        """Metrics of the guess against the ground truth, with chance levels."""


def label_of_row(row_of_label) -> np.ndarray:
    """The inverse permutation: which label each W row holds."""
    row_of_label = np.asarray(row_of_label)
    out = np.empty(len(row_of_label), dtype=np.int64)
    out[row_of_label] = np.arange(len(row_of_label))
    return out
