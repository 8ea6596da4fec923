"""The run plan: a run's settings, validated and resolved once, immutable and typed.

:func:`secure_fed.config.plan_builder.build_plan` turns a validated config into a :class:`RunPlan`; everything that
builds, estimates, validates or runs reads the plan's parts, never the config object (which the plan does not hold:
every part is a frozen copy). The core's parts are the frozen dataclasses below, one per config section, with the
config's field names (``plan.training.rounds`` reads what ``training.rounds`` set). A plugin's section (``privacy``,
``ckks``, ``attacks``, …) is its own typed, frozen model, read with :meth:`RunPlan.part`; the algorithm's part is its
parameters model (:class:`~secure_fed.algorithms.params.base.AlgorithmParams`, frozen).

This module imports nothing from :mod:`secure_fed.config` (an import contract keeps the schema out) and passes
``mypy --strict``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

    from secure_fed.algorithms.params.base import AlgorithmParams

T = TypeVar("T", bound="BaseModel")


@dataclass(frozen=True)
class SyntheticPlan:
    """``dataset.synthetic``."""

    num_train: int
    num_test: int
    num_features: int
    num_labels: int
    num_groups: int
    cooccurrence: float
    noise_label_rate: float
    group_similarity: float
    feature_noise: float
    zipf: float


@dataclass(frozen=True)
class MosaicsPlan:
    """``dataset.mosaics``."""

    grid: int
    tile_size: int
    num_train: int
    num_test: int


@dataclass(frozen=True)
class DatasetPlan:
    """``dataset``."""

    name: str | None
    root: str | None
    format: Literal["arff", "xc", "voc", "coco"] | None
    train: str | None
    test: str | None
    labels: str | None
    train_split: str | None
    test_split: str | None
    fold: int
    test_fraction: float
    split_seed: int
    evaluate_on: Literal["test", "validation"]
    validation_fraction: float
    drop_attributes: tuple[str, ...]
    #: resolved when the run is built (:func:`secure_fed.model_choices.resolve_run_choices`): the loaded data's kind
    feature_kind: Literal["auto", "sparse", "dense", "image"]
    #: resolved: ``auto`` is False under the dp layer, True otherwise
    drop_empty_labels: bool
    image_size: int
    train_set: str | None
    test_set: str | None
    train_annotations: str | None
    test_annotations: str | None
    synthetic: SyntheticPlan
    mosaics: MosaicsPlan


@dataclass(frozen=True)
class PartitionPlan:
    """``partition``."""

    name: Literal["positive_only", "iid", "dirichlet", "cmda", "natural"]
    num_clients: int | None
    alpha: float
    kmodes_inits: int
    client_ids_file: str | None


@dataclass(frozen=True)
class CTranPlan:
    """``model.ctran``."""

    layers: int
    heads: int
    #: resolved: ``auto`` is 0.1 (DP-SGD's steps run without dropout whatever the rate, :mod:`secure_fed.algorithms.client`)
    dropout: float
    #: the config left ``dropout`` at ``auto`` (a rate set explicitly above 0 is refused with ``privacy.local``)
    dropout_auto: bool
    min_unknown: float
    #: resolved when the run is built: ``scene_blocks`` (scene's 49 blocks of 6 colour moments) or ``chunks``
    tokens: Literal["auto", "chunks", "scene_blocks"]
    token_size: int
    text_tokens: int

    @property
    def dropout_rate(self) -> float:
        """The dropout the model is built with."""
        return self.dropout


@dataclass(frozen=True)
class ModelPlan:
    """``model``."""

    family: Literal["embedding", "linear_head", "ctran"]
    #: ``name``, ``preprocessing`` and ``sparse_input`` are resolved when the run is built (for the loaded data)
    name: Literal["auto", "sparse_text", "mlp", "resnet18", "resnet50"]
    embedding_dim: int
    embed_dim: int
    hidden_dims: tuple[int, ...] | None
    preprocessing: Literal["auto", "rsqrt_nnz", "standardize", "image", "none"]
    sparse_input: bool | Literal["auto"]
    weights: str | None
    fixed_encoder: bool
    encoder_init: Literal["kaiming", "orthogonal"]
    ctran: CTranPlan
    text_encoder: str
    label_prompt: str


@dataclass(frozen=True)
class ServerOptimizerPlan:
    """``training.server_optimizer``."""

    name: Literal["fedavg", "fedavgm", "fedadam", "fedadagrad", "fedyogi"]
    lr: float
    momentum: float
    beta1: float
    beta2: float
    tau: float
    bias_correction: bool
    apply_to_rows: bool


@dataclass(frozen=True)
class TrainingPlan:
    """``training``."""

    rounds: int
    client_fraction: float
    clients_per_round: int | None
    sampling: Literal["uniform", "proportional", "poisson", "cyclic"]
    aggregation: Literal["uniform", "num_examples"]
    local_epochs: int
    batch_size: int
    client_optimizer: Literal["sgd", "adam"]
    client_lr: float
    client_momentum: float
    weight_decay: float
    #: resolved when the run is built (for its device and data)
    precision: Literal["auto", "fp32", "bf16"]
    #: resolved when the run is built (for this machine and the run's clients)
    threads: int | Literal["auto"]
    executor: Literal["sequential", "vectorized"]
    #: resolved by the plan builder: ``auto`` is true where every listed layer takes row-sparse updates
    sparse_updates: bool | Literal["auto"]
    #: resolved when the run is built (the stack, the executor and the run's callbacks decide)
    deferred_updates: bool | Literal["auto"]
    chunk_clients: int | None
    server_optimizer: ServerOptimizerPlan
    #: the config left ``threads`` at ``auto`` (``summary.json`` records the setting as written, with why)
    threads_auto: bool = False
    #: why ``threads`` has its value (:func:`secure_fed.threads.auto_threads`'s words, or ``training.threads``)
    threads_why: str = "training.threads"

    def cohort_size(self, num_clients: int) -> int:
        """Clients a fixed-size round samples: ``clients_per_round`` (at most N), else ⌈client_fraction·N⌉ (under
        Poisson sampling, the most a round can hold is N and this is about its mean)."""
        if self.clients_per_round is not None:
            return min(num_clients, self.clients_per_round)
        return min(num_clients, max(1, math.ceil(self.client_fraction * num_clients)))


@dataclass(frozen=True)
class EvaluationPlan:
    """``evaluation``."""

    every: int
    ks: tuple[int, ...]
    threshold: float
    max_test: int | None
    center_scores: bool
    remove_shared_direction: bool
    target_metric: str
    target_value: float | None


@dataclass(frozen=True)
class OutputPlan:
    """``output``."""

    dir: str
    name: str | None
    checkpoint_every: int
    progress: bool
    log_messages: bool
    tensorboard: bool


@dataclass(frozen=True)
class FlowerPlan:
    """``flower``."""

    num_supernodes: int | None
    client_cpus: float
    max_in_flight: int
    timeout_s: float
    on_client_failure: Literal["drop", "stop"]
    stage_timeout_s: float = 300.0
    debug_write_inputs: bool = False


@dataclass(frozen=True)
class RunPlan:
    """A run's settings, resolved (see the module docstring)."""

    seed: int
    #: resolved when the run is built (:func:`secure_fed.engine.builders.resolve_device`)
    device: Literal["auto", "cpu", "cuda"]
    backend: Literal["inprocess", "flower"]
    #: the protocol layers, innermost (client side) first
    protocols: tuple[str, ...]
    dataset: DatasetPlan
    partition: PartitionPlan
    model: ModelPlan
    #: the algorithm's parameters model (frozen), with its declared capabilities
    algorithm: AlgorithmParams
    training: TrainingPlan
    evaluation: EvaluationPlan
    output: OutputPlan
    flower: FlowerPlan
    #: the validated config as YAML (``dump_config``): what ``config.yaml`` records and a resume compares; never parsed
    #: outside :mod:`secure_fed.config`
    config_yaml: str = ""
    #: the plugins' sections by name (``privacy``, ``ckks``, ``attacks``, …): frozen copies of their own models
    sections: Mapping[str, BaseModel] = field(default_factory=dict)

    def part(self, kind: type[T]) -> T:
        """The plugin section of model ``kind`` (e.g. ``plan.part(PrivacyConfig)``)."""
        for section in self.sections.values():
            if isinstance(section, kind):
                return section
        raise KeyError(f"the plan has no {kind.__name__} section")

    def section(self, name: str) -> BaseModel:
        """The plugin section called ``name`` in the YAML."""
        return self.sections[name]

    def uses(self, layer: str) -> bool:
        """The protocol stack lists ``layer``."""
        return layer in self.protocols
