"""The typed settings each protocol layer is built with, and the one place that reads them from a run's config.

A layer never receives the whole :class:`~secure_fed.config.schema.ExperimentConfig`: its spec's ``settings``
(:mod:`protocols.layer_specs`) calls the builder here, which takes the layer's own section and the few public facts of
other sections it needs; the layer is then built as ``Layer(settings, env)`` (:mod:`secure_fed.engine.layers`).
Light on purpose (no torch): the specs import it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainingFacts:
    """The public training schedule a layer needs (from ``training``)."""

    rounds: int
    client_fraction: float
    clients_per_round: int | None
    sampling: str
    local_epochs: int
    batch_size: int
    aggregation: str
    #: ``cohort_size(num_clients)``: clients a fixed-size round samples (``TrainingConfig.cohort_size``)
    cohort_size: Callable[[int], int]
    #: ``training.client_lr``: the server turns ``privacy.local.noise: shares``' summed gradient into the step
    client_lr: float = 0.01

    @classmethod
    def of(cls, training: Any) -> TrainingFacts:
        t = training
        return cls(rounds=t.rounds, client_fraction=t.client_fraction, clients_per_round=t.clients_per_round,
                   sampling=t.sampling, local_epochs=t.local_epochs, batch_size=t.batch_size,
                   aggregation=t.aggregation, cohort_size=t.cohort_size, client_lr=t.client_lr)  # fmt: skip


@dataclass(frozen=True)
class KeyedHashingSettings:
    section: Any  #: ``keyed_hashing`` (:class:`~protocols.config_sections.KeyedHashingConfig`)


@dataclass(frozen=True)
class DPSettings:
    """What the ``dp`` layer reads."""

    privacy: Any  #: its own section (:class:`~protocols.config_sections.PrivacyConfig`)
    #: the algorithm's section: its name (and, with the algorithms' declared capabilities, what they declare)
    algorithm: Any
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
    section: Any  #: ``secure_aggregation`` (:class:`~protocols.config_sections.SecureAggregationConfig`)
    training: TrainingFacts
    log_messages: bool  #: ``output.log_messages``: keep each round's transcript


@dataclass(frozen=True)
class CKKSSettings:
    section: Any  #: ``ckks`` (:class:`~protocols.config_sections.CKKSConfig`)
    #: ``privacy.noise_seed``: the key holders' decryption noise from a number anyone who knows it can redraw (debugging)
    noise_seed: int | None
    aggregation: str  #: ``training.aggregation``


def keyed_hashing_settings(cfg) -> KeyedHashingSettings:
    return KeyedHashingSettings(section=cfg.keyed_hashing)


def dp_settings(cfg) -> DPSettings:
    p = cfg.privacy
    sa = "secure_aggregation" in cfg.protocols
    return DPSettings(
        privacy=p,
        algorithm=cfg.algorithm,
        label_set_algorithm=cfg.algorithm.capabilities.collects_label_sets,
        training=TrainingFacts.of(cfg.training),
        instance_divisor=None if p.instance is None else p.instance.divisor(cfg.dataset),
        on_flower=cfg.backend == "flower",
        encoding=(cfg.secure_aggregation.clip_range, int(cfg.secure_aggregation.frac_bits)) if sa else None,
        fixed_encoder=cfg.model.fixed_encoder,
    )


def secure_aggregation_settings(cfg) -> SecureAggregationSettings:
    return SecureAggregationSettings(
        section=cfg.secure_aggregation, training=TrainingFacts.of(cfg.training), log_messages=cfg.output.log_messages
    )


def ckks_settings(cfg) -> CKKSSettings:
    return CKKSSettings(section=cfg.ckks, noise_seed=cfg.privacy.noise_seed, aggregation=cfg.training.aggregation)
