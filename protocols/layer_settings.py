"""The typed settings each protocol layer is built with, and the one place that reads them from a run's plan.

A layer never receives the whole :class:`~secure_fed.plan.RunPlan`: its spec's ``settings``
(:mod:`protocols.layer_specs`) calls the builder here, which takes the layer's own section (``plan.part(...)``) and
the few public facts of other parts it needs; the layer is then built as ``Layer(settings, env)``
(:class:`~secure_fed.plugin_api.layers.ProtocolLayer`). Light on purpose (no torch): the specs import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from protocols.config_sections import CKKSConfig, KeyedHashingConfig, PrivacyConfig, SecureAggregationConfig

if TYPE_CHECKING:
    from secure_fed.plugin_api.layers import AlgorithmParams, RunPlan, TrainingPlan


@dataclass(frozen=True)
class TrainingFacts:
    """The public training schedule a layer needs (from the plan's ``training`` part)."""

    rounds: int
    client_fraction: float
    clients_per_round: int | None
    sampling: Literal["uniform", "proportional", "poisson", "cyclic"]
    local_epochs: int
    batch_size: int
    aggregation: Literal["uniform", "num_examples"]
    #: ``cohort_size(num_clients)``: clients a fixed-size round samples (:meth:`~secure_fed.plan.TrainingPlan.cohort_size`)
    cohort_size: Callable[[int], int]
    #: ``training.client_lr``: the server turns ``privacy.local.noise: shares``' summed gradient into the step
    client_lr: float = 0.01

    @classmethod
    def of(cls, training: TrainingPlan) -> TrainingFacts:
        """The facts of the plan's ``training`` part."""
        t = training
        return cls(rounds=t.rounds, client_fraction=t.client_fraction, clients_per_round=t.clients_per_round,
                   sampling=t.sampling, local_epochs=t.local_epochs, batch_size=t.batch_size,
                   aggregation=t.aggregation, cohort_size=t.cohort_size, client_lr=t.client_lr)  # fmt: skip


@dataclass(frozen=True)
class KeyedHashingSettings:
    """What the ``keyed_hashing`` layer reads."""

    section: KeyedHashingConfig  #: its own section, ``keyed_hashing``


@dataclass(frozen=True)
class DPSettings:
    """What the ``dp`` layer reads."""

    privacy: PrivacyConfig  #: its own section, ``privacy``
    #: the algorithm's parameters (its name, and what its declared capabilities say)
    algorithm: AlgorithmParams
    #: the algorithm collects label sets for the server's W update (FedALC)
    label_set_algorithm: bool
    training: TrainingFacts
    #: the W step's public divisor B̄ (``privacy.instance.divisor(dataset)``), None without ``privacy.instance``
    instance_divisor: float | None
    #: ``backend: flower`` (each node draws its own clients' keys)
    on_flower: bool
    #: secure aggregation's encoding ``(clip_range, frac_bits)`` when the stack lists it, else None
    encoding: tuple[float, int] | None
    #: ``model.fixed_encoder``: θ's encoder is not trained (its released value is its data-independent initialisation)
    fixed_encoder: bool = False

    @property
    def encoding_grid(self) -> float | None:
        """Secure aggregation's fixed-point step 2^-frac_bits (the finest grid a noise share may use), or None."""
        return None if self.encoding is None else 2.0 ** -int(self.encoding[1])


@dataclass(frozen=True)
class SecureAggregationSettings:
    """What the ``secure_aggregation`` layer reads."""

    section: SecureAggregationConfig  #: its own section, ``secure_aggregation``
    training: TrainingFacts
    log_messages: bool  #: ``output.log_messages``: keep each round's transcript


@dataclass(frozen=True)
class CKKSSettings:
    """What the ``ckks`` layer reads."""

    section: CKKSConfig  #: its own section, ``ckks``
    #: ``privacy.noise_seed``: the key holders' decryption noise from a number anyone who knows it can redraw (debugging)
    noise_seed: int | None
    aggregation: Literal["uniform", "num_examples"]  #: ``training.aggregation``


def secure_aggregation_encoding(plan: RunPlan) -> tuple[float, int] | None:
    """Secure aggregation's fixed-point encoding ``(clip_range, frac_bits)`` when the plan's stack lists it, else None."""
    if "secure_aggregation" not in plan.protocols:
        return None
    s = plan.part(SecureAggregationConfig)
    return s.clip_range, int(s.frac_bits)


def keyed_hashing_settings(plan: RunPlan) -> KeyedHashingSettings:
    """The ``keyed_hashing`` layer's settings."""
    return KeyedHashingSettings(section=plan.part(KeyedHashingConfig))


def dp_settings(plan: RunPlan) -> DPSettings:
    """The ``dp`` layer's settings."""
    p = plan.part(PrivacyConfig)
    return DPSettings(
        privacy=p,
        algorithm=plan.algorithm,
        label_set_algorithm=plan.algorithm.capabilities.collects_label_sets,
        training=TrainingFacts.of(plan.training),
        instance_divisor=None if p.instance is None else p.instance.divisor(plan.dataset),
        on_flower=plan.backend == "flower",
        encoding=secure_aggregation_encoding(plan),
        fixed_encoder=plan.model.fixed_encoder,
    )


def secure_aggregation_settings(plan: RunPlan) -> SecureAggregationSettings:
    """The ``secure_aggregation`` layer's settings."""
    return SecureAggregationSettings(
        section=plan.part(SecureAggregationConfig),
        training=TrainingFacts.of(plan.training),
        log_messages=plan.output.log_messages,
    )


def ckks_settings(plan: RunPlan) -> CKKSSettings:
    """The ``ckks`` layer's settings."""
    return CKKSSettings(
        section=plan.part(CKKSConfig), noise_seed=plan.part(PrivacyConfig).noise_seed, aggregation=plan.training.aggregation
    )
