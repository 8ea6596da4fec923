"""The experiment configuration: one YAML file, validated by pydantic.

Unknown keys, wrong types and out-of-range values are rejected; see
:func:`secure_fed.config.loader.load_config` for the one-line error format.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from secure_fed.errors import unknown_name


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SyntheticConfig(_Strict):
    num_train: int = Field(3000, ge=10)
    num_test: int = Field(1000, ge=10)
    num_features: int = Field(64, ge=2)
    num_labels: int = Field(20, ge=2)
    num_groups: int = Field(5, ge=1)
    cooccurrence: float = Field(0.3, ge=0.0, le=1.0)
    noise_label_rate: float = Field(0.01, ge=0.0, le=1.0)
    group_similarity: float = Field(0.5, ge=0.0, le=1.0)
    feature_noise: float = Field(0.6, ge=0.0)
    zipf: float = Field(0.8, ge=0.0)


class DatasetConfig(_Strict):
    """Either ``name`` (registry or ``synthetic``) or ``format`` plus file paths."""

    name: str | None = "synthetic"
    root: str | None = Field(None, description="data root; default $SECURE_FED_DATA or ~/.cache/secure-fed/data")
    format: Literal["arff", "xc"] | None = None
    train: str | None = None
    test: str | None = None
    labels: str | None = None
    train_split: str | None = None
    test_split: str | None = None
    fold: int = Field(0, ge=0)
    feature_kind: Literal["auto", "sparse", "dense"] = "auto"
    synthetic: SyntheticConfig = SyntheticConfig()

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        if self.format is not None:
            if self.train is None:
                raise ValueError("dataset.format is set, so dataset.train (a file path) is required")
        elif not self.name:
            raise ValueError("give dataset.name (a registered dataset or 'synthetic') or dataset.format with file paths")
        return self


class PartitionConfig(_Strict):
    name: Literal["positive_only", "iid", "dirichlet"] = "positive_only"
    num_clients: int | None = Field(None, ge=1)
    alpha: float = Field(0.5, gt=0.0)


class ModelConfig(_Strict):
    name: Literal["auto", "sparse_text", "mlp"] = "auto"
    embedding_dim: int = Field(512, ge=2, description="d, the dimension of g(x) and of W's rows")
    embed_dim: int = Field(512, ge=2, description="sparse_text: width of the linear input embedding")
    hidden_dims: list[int] | None = Field(None, description="default: [1024, 1024] for sparse_text, [256] for mlp")
    preprocessing: Literal["auto", "rsqrt_nnz", "standardize", "none"] = "auto"


class AlgorithmConfig(_Strict):
    name: Literal["fedavg", "fedavg_fixed", "fedaws", "fedalc", "fedalc_fixed", "oracle"] = "fedalc"
    lam: float = Field(10.0, ge=0.0, description="λ, the regulariser's learning-rate multiplier")
    reg_lr: float = Field(1e-4, gt=0.0, description="η, server learning rate of the regulariser step")
    k: int = Field(5, ge=1, description="negative mining: number of nearest classes per class")
    negative_mining: bool = Field(True, description="fedaws: eq. 8 (top-k) instead of eq. 7")
    margin: float = Field(1.0, gt=0.0, description="ν in cosine distance (fedalc eq. 11/12, fedaws eq. 7)")
    gamma_scale: Literal["classes_minus_one"] | float = "classes_minus_one"
    normalize_gamma: bool = Field(True, description="fedalc: use γ (eq. 10) rather than σ (eq. 9)")
    tokenizer: Literal["sha256"] = "sha256"
    alpha: float = Field(1.0, ge=0.0, description="fedalc_fixed: weight of positive pairs in eq. 12")
    beta: float = Field(1.0, ge=0.0, description="fedalc_fixed: weight of negative pairs in eq. 12")
    fixed_steps: int = Field(500, ge=0, description="fedalc_fixed: server steps on reg_fc before training")
    fixed_lr: float = Field(1.0, gt=0.0, description="fedalc_fixed: η of the reg_fc steps")
    oracle_loss: Literal["softmax", "contrastive"] = "softmax"


class ServerOptimizerConfig(_Strict):
    name: Literal["fedavg", "fedavgm", "fedadam", "fedadagrad", "fedyogi"] = "fedadam"
    lr: float = Field(1e-3, gt=0.0)
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    beta1: float = Field(0.9, ge=0.0, lt=1.0)
    beta2: float = Field(0.999, ge=0.0, lt=1.0)
    tau: float = Field(1e-8, gt=0.0, description="adaptivity ε of FedAdam/FedAdagrad/FedYogi")
    bias_correction: bool = True
    apply_to_rows: bool = Field(False, description="also run the server optimiser on W rows (else rows are written back)")


class TrainingConfig(_Strict):
    rounds: int = Field(50, ge=1)
    client_fraction: float = Field(1.0, gt=0.0, le=1.0)
    sampling: Literal["uniform", "proportional", "poisson"] = "uniform"
    aggregation: Literal["uniform", "num_examples"] = Field("uniform", description="weights when averaging θ")
    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1)
    client_optimizer: Literal["sgd", "adam"] = "sgd"
    client_lr: float = Field(0.01, gt=0.0)
    client_momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16: autocast client forward passes (fp32 weights)")
    server_optimizer: ServerOptimizerConfig = ServerOptimizerConfig()


class EvaluationConfig(_Strict):
    every: int = Field(10, ge=1, description="evaluate every N rounds (and after the last)")
    ks: list[int] = Field(default_factory=lambda: [1, 3, 5])
    threshold: float = 0.5
    max_test: int | None = Field(None, ge=1, description="evaluate on the first N test rows only")


class OutputConfig(_Strict):
    dir: str = "runs"
    name: str | None = None
    checkpoint_every: int = Field(25, ge=1)
    progress: bool = True
    log_messages: bool = Field(False, description="keep every client/server message in memory (tests, audits)")


class _DPUnitConfig(_Strict):
    clip_norm: float = Field(1.0, gt=0.0, description="L2 clipping bound C (per privacy unit's contribution)")
    noise_multiplier: float | None = Field(None, gt=0.0, description="σ; noise std is σ·C. Omit to calibrate from target_epsilon")
    target_epsilon: float | None = Field(None, gt=0.0, description="budget: calibrates σ if noise_multiplier is unset; enforced")


class InstanceDPConfig(_DPUnitConfig):
    """DP-SGD on the server's class-embedding update (FedALC eq. 11, FedALC-fixed eq. 12); the unit is a label set."""

    sample_rate: float = Field(0.1, gt=0.0, le=1.0, description="q: Poisson sampling rate of label sets per server step")


class ClientDPConfig(_DPUnitConfig):
    """DP-FedAvg: each client's whole update (θ and its rows) clipped to C, Gaussian noise on the sum."""

    noise: Literal["server", "clients"] = Field(
        "server",
        description="server: the server adds N(0, σ²C²) to the sum (trusted with the un-noised sum); clients: each "
        "client adds N(0, σ²C²/t) before a secure sum of ≥ t updates (needs secure_aggregation or ckks)",
    )


class PrivacyConfig(_Strict):
    """Differential privacy settings; active only when ``dp`` is listed in ``protocols``."""

    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    accountant: Literal["rdp", "prv"] = Field("rdp", description="the accountant that calibrates σ, stops and reports")
    report_gdp: bool = Field(
        False, description="also report Opacus's GDP ε (an approximation that can understate ε; never used to calibrate or stop)"
    )
    noise_seed: int | None = Field(
        None,
        description="debugging only: derive every DP noise and sampling draw from this number, so runs repeat; the ε then "
        "does not hold against anyone who knows it. Default: fresh secrets from os.urandom, kept in private checkpoints",
    )
    instance: InstanceDPConfig | None = None
    client: ClientDPConfig | None = None

    @field_validator("accountant", mode="before")
    @classmethod
    def _no_gdp(cls, v):
        if v == "gdp":
            raise ValueError(
                "gdp is an approximation that can understate ε (at σ 1.23, q 0.1, 50 steps: GDP 2.84 against PRV 3.53), "
                "so it may not calibrate σ or stop training; use rdp or prv, and set privacy.report_gdp: true to see it"
            )
        return v


class KeyedHashingConfig(_Strict):
    pseudonymize_labels: bool = Field(True, description="label pseudonyms HMAC(run key, 'label:'+name); rows in keyed order")


class SecureAggregationConfig(_Strict):
    threshold: float = Field(0.6, gt=0.0, le=1.0, description="t as a fraction of each client's neighbourhood (incl. itself)")
    neighbors: int | None = Field(None, ge=2, description="SecAgg+ neighbours per client; null = complete graph (SecAgg)")
    clip_range: float = Field(1.0e4, gt=0.0, description="values are clipped to [-R, R] before fixed-point encoding")
    frac_bits: int = Field(24, ge=4, le=40, description="fixed-point fractional bits")
    modulus_bits: int = Field(64, ge=16, le=64, description="arithmetic modulo 2^bits")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="simulated probability that a client drops at each stage")


class CKKSConfig(_Strict):
    poly_modulus_degree: int = Field(8192, description="power of two, ≥ 4096")
    coeff_mod_bit_sizes: list[int] = Field(default_factory=lambda: [60, 40, 40, 60])
    global_scale_bits: int = Field(40, ge=20, le=60, description="global scale 2^bits")
    key_holders: int = Field(3, ge=1, description="clients (smallest ids) that hold the secret key and decrypt sums")
    encrypt: list[str] = Field(
        default_factory=lambda: ["all"],
        description="parameter groups to encrypt: 'all', 'theta', 'rows', or θ parameter-name prefixes; the rest is plaintext",
    )

    @model_validator(mode="after")
    def _power_of_two(self) -> CKKSConfig:
        n = self.poly_modulus_degree
        if n < 4096 or n & (n - 1):
            raise ValueError(f"ckks.poly_modulus_degree must be a power of two ≥ 4096, got {n}")
        return self


class TokenLinkageConfig(_Strict):
    pool_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="fraction of the training instances in the attacker's candidate pool"
    )
    distractors: int = Field(2000, ge=0, description="non-training candidates (test-split instances) added to the pool")


class LabelDeanonymizationConfig(_Strict):
    iterations: int = Field(30, ge=0, description="co-occurrence refinement rounds after the frequency seed")


class MembershipInferenceConfig(_Strict):
    shadows: int = Field(
        16, ge=0, description="LiRA shadow runs on random halves of the target pool (online and offline; 0: LOSS only)"
    )
    bootstrap: int = Field(200, ge=10, description="bootstrap resamples for the AUC confidence interval")
    shadow_dir: str | None = Field(None, description="where shadow runs are cached (default RUN_DIR/shadows)")


class OneRunAuditConfig(_Strict):
    canaries: int = Field(1000, ge=0, description="m Dirac canaries in θ, each inserted with probability ½ (0: off)")
    canary_norm: float | None = Field(None, gt=0.0, description="size of a canary; default privacy.client.clip_norm, else 0.05")
    confidence: float = Field(0.95, gt=0.5, lt=1.0)


class UpdateInversionConfig(_Strict):
    targets: int = Field(10, ge=1, description="clients of the captured round whose updates are attacked")


class AttacksConfig(_Strict):
    """Attacks and audits (``threat_models``) run on the finished run; ``secure-fed list`` shows them."""

    run: list[str] = Field(default_factory=list, description="attack names; [all] for every registered attack")
    token_linkage: TokenLinkageConfig = TokenLinkageConfig()
    label_deanonymization: LabelDeanonymizationConfig = LabelDeanonymizationConfig()
    membership_inference: MembershipInferenceConfig = MembershipInferenceConfig()
    one_run_audit: OneRunAuditConfig = OneRunAuditConfig()
    update_inversion: UpdateInversionConfig = UpdateInversionConfig()

    @model_validator(mode="after")
    def _known(self) -> AttacksConfig:
        from threat_models import ATTACKS

        for name in self.run:
            if name != "all" and name not in ATTACKS:
                raise ValueError(unknown_name("attack", name, ATTACKS))
        return self

    def names(self) -> list[str]:
        from threat_models import ATTACKS

        return list(ATTACKS) if "all" in self.run else list(dict.fromkeys(self.run))


class ExperimentConfig(_Strict):
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dataset: DatasetConfig = DatasetConfig()
    partition: PartitionConfig = PartitionConfig()
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    training: TrainingConfig = TrainingConfig()
    protocols: list[str] = Field(default_factory=list, description="protocol layers, innermost (client side) first")
    privacy: PrivacyConfig = PrivacyConfig()
    keyed_hashing: KeyedHashingConfig = KeyedHashingConfig()
    secure_aggregation: SecureAggregationConfig = SecureAggregationConfig()
    ckks: CKKSConfig = CKKSConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    output: OutputConfig = OutputConfig()
    attacks: AttacksConfig = AttacksConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> ExperimentConfig:
        if self.protocols:
            from protocols import validate_stack

            validate_stack(self)
        needs_positive_only = self.algorithm.name in ("fedalc", "fedalc_fixed")
        if needs_positive_only and self.partition.name != "positive_only":
            raise ValueError(
                f"algorithm.name={self.algorithm.name} collects label sets from one-label clients, "
                "so partition.name must be positive_only"
            )
        return self
