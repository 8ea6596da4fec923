"""The YAML sections the protocol layers own: ``privacy``, ``keyed_hashing``, ``secure_aggregation``, ``ckks``.

Pydantic models only (no torch): they register with the core's schema through the
``secure_fed.config_sections`` entry points, so ``secure-fed validate`` checks them without
importing a layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from secure_fed.plugin_api.layers import SECRET

if TYPE_CHECKING:
    from secure_fed.plugin_api.layers import DatasetPlan


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class _DPUnitConfig(_Strict):
    clip_norm: float = Field(1.0, gt=0.0, le=1e12, description="L2 clipping bound C (per privacy unit's contribution)")
    noise_multiplier: float | None = Field(
        None,
        ge=0.0,
        le=1e6,
        description="σ; noise std is σ·C. Omit to calibrate from target_epsilon. 0: the noiseless control — the unit "
        "clips, bounds and samples exactly as under DP but draws no noise, and its ε is reported as ∞ (a run's "
        "ceiling with the same levers; no target_epsilon beside it)",
    )
    target_epsilon: float | None = Field(
        None,
        gt=0.0,
        le=1e6,
        description="budget: calibrates σ if noise_multiplier is unset; beside a given noise_multiplier, a cap: training "
        "stops before the step that would pass it (validate says after how many steps)",
    )


#: the contribution bound's description, shared by the units that can carry it
_BOUND = (
    "positive_only partition: the most clients (labels) one training instance may enter, a public bound that σ, the "
    "planned steps and ε are computed from (never the data's largest label count); an instance with more labels is "
    "bounded by privacy.over_bound. Required by privacy.local; the client unit's instance-level report uses it. A "
    "centralised trainer (the oracle as the central DP reference) bounds nothing: each instance is on it once"
)


class InstanceDPConfig(_DPUnitConfig):
    """DP-SGD on the server's class-embedding update (FedALC eq. 11, FedALC-fixed eq. 12); the unit is a label set."""

    sample_rate: float = Field(0.1, gt=0.0, le=1.0, description="q: Poisson sampling rate of label sets per server step")
    expected_batch_size: float | Literal["auto"] = Field(
        "auto",
        description="B̄: the public number the step's noisy sum is divided by: q × a public estimate of the training "
        "set's size, never the realised count of label sets (a private divisor breaks the accounting). auto: q × "
        "dataset.synthetic.num_train for synthetic data (a config value); other data must give a number",
    )

    @field_validator("expected_batch_size", mode="before")
    @classmethod
    def _positive_or_auto(cls, v):
        if v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1e12:
            raise ValueError(f"give a positive number (q × a public estimate of the training set's size) or auto, not {v!r}")
        return v

    def divisor(self, dataset: DatasetPlan) -> float | None:
        """B̄ for a run on ``dataset`` (the plan's part), or None where auto has no public size to use."""
        if self.expected_batch_size != "auto":
            return float(self.expected_batch_size)
        if dataset.name == "synthetic":
            return self.sample_rate * dataset.synthetic.num_train
        return None

    max_labels_per_instance: int | None = Field(None, ge=1, le=1_000_000, description=_BOUND)


class LocalDPConfig(_DPUnitConfig):
    """DP-SGD inside each client's local training (per-sample gradients, per-sample clipping to C, Gaussian noise
    σ·C on each step's sum, Poisson-sampled batches); its steps join the instance unit's ledger."""

    batch_sample_rate: float = Field(
        0.25, gt=0.0, le=1.0,
        description="q: each local step takes every example of the client independently with probability q "
        "(Poisson sampling, from the client's own secret); a local epoch is round(1/q) steps",
    )  # fmt: skip
    max_labels_per_instance: int | None = Field(None, ge=1, le=1_000_000, description=_BOUND)
    copy_clip: Literal["full", "split"] = Field(
        "full",
        description="full: every copy of an instance (one per client it sits on: its labels in the positive_only "
        "partition) is clipped to C, so one instance on k ≤ m clients moves the clients' releases by √k·C together and "
        "the ledger counts each copy's steps; split: a copy of an instance on k clients is clipped to C/√k, so its "
        "copies together move the releases by ≤ C and the ledger counts one copy (at the same ε, σ is √m times "
        "smaller than with full: an instance on one client gets √m more signal per unit of noise, one on k clients "
        "√(m/k) more on each copy). Needs batch_sample_rate 1 (every copy in every step) and noise: local",
    )  # fmt: skip
    noise: Literal["local", "shares"] = Field(
        "local",
        description="local: each client adds the full discrete Gaussian noise σ(C + γ√d) to each of its steps (DP-SGD "
        "as Opacus runs it); shares: distributed DP-FedSGD — each client runs one step a round (local_epochs 1, "
        "batch_sample_rate > 2/3), adds a discrete Gaussian share of std σ(C + γ√d)/√t to its clipped gradient sum and "
        "sends that sum through a secure sum of ≥ t updates, so the round's sum carries the noise once (the cohort's "
        "√n-fold less than local); needs secure_aggregation (CKKS decrypts approximately), plain client SGD, one client "
        "per instance, and privacy.client unset; the ε holds against the server only with the secure sum",
    )


class AdaptiveClippingConfig(_Strict):
    """Adaptive clipping (Andrew et al. 2021, Algorithm 1): the clip norm follows a quantile of the update norms,
    from noisy counts (:mod:`protocols.dp.adaptive_clipping`)."""

    target_quantile: float = Field(
        0.5, gt=0.0, lt=1.0, description="γ: the fraction of sampled clients whose update the clip norm should leave unclipped"
    )
    learning_rate: float = Field(
        0.2, gt=0.0, le=10.0, description="η_C: the geometric update C ← C·exp(−η_C(b̃ − γ)) of the clip norm each round"
    )
    count_noise_multiplier: float = Field(
        ..., gt=0.0, le=1e6,
        description="σ_b: std of the Gaussian noise on the count of sampled clients below C (in clients); must exceed "
        "σ/2. The update's noise multiplier becomes σ_Δ = (σ^-2 − (2σ_b)^-2)^-1/2 so that a round costs one Gaussian "
        "mechanism at σ (Theorem 1), which the accountant charges",
    )  # fmt: skip


class ClientDPConfig(_DPUnitConfig):
    """DP-FedAvg: each client's whole update (θ and its rows) clipped to C, Gaussian noise on the sum."""

    noise: Literal["server", "clients"] = Field(
        "server",
        description="server: the server adds N(0, σ²C²) to the sum (trusted with the un-noised sum); clients: each "
        "client adds a discrete Gaussian share of std σ(C + γ√d)/√t before a secure sum of ≥ t updates (needs "
        "secure_aggregation: CKKS decrypts approximately, so it is refused)",
    )
    weight_cap: float | None = Field(
        None, gt=0.0, le=1e12,
        description="algorithms whose clients report an aggregation weight computed from their data (flag, eq. 2): "
        "the public bound W̄; each client scales its clipped update by min(w, W̄)/W̄ ≤ 1 and reports weight 1, so the "
        "sensitivity stays C and no weight leaves the client outside the DP-protected update (required for flag)",
    )  # fmt: skip
    max_labels_per_instance: int | None = Field(None, ge=1, le=1_000_000, description=_BOUND)
    adaptive_clipping: AdaptiveClippingConfig | None = Field(
        None,
        description="adaptive clipping (Andrew et al. 2021): clip_norm is the initial C, then C follows target_quantile "
        "of the update norms through a noisy count of clients below it, released per round (privacy.client.clip_norm "
        "on each metrics line); null: the fixed clip_norm. Needs noise: server without a secure-sum layer",
    )

    @model_validator(mode="after")
    def _count_noise_defines_update_noise(self) -> ClientDPConfig:
        a, sigma = self.adaptive_clipping, self.noise_multiplier
        if sigma == 0.0 and (a is not None or self.mechanism != "gaussian"):
            raise ValueError(
                "noise_multiplier 0 (the noiseless control) needs mechanism: gaussian and no adaptive_clipping (the "
                "tree's, the banded factorisation's and the clip count's noise all scale with σ)"
            )
        if a is not None and sigma is not None and not a.count_noise_multiplier > sigma / 2:
            raise ValueError(
                f"privacy.client.adaptive_clipping.count_noise_multiplier {a.count_noise_multiplier:g} must exceed "
                f"noise_multiplier/2 = {sigma / 2:g}: the update's noise multiplier (σ^-2 − (2σ_b)^-2)^-1/2 is undefined "
                "otherwise (Andrew et al. 2021, Theorem 1)"
            )
        return self

    mechanism: Literal["gaussian", "tree", "banded"] = Field(
        "gaussian",
        description="gaussian: independent noise on each round's sum (DP-FedAvg), amplified by Poisson client sampling "
        "when client_fraction < 1; tree: DP-FTRL (Kairouz et al. 2021): every client in every round (no sampling, no "
        "amplification), the server releases noisy prefix sums of the rounds' clipped sums by binary tree aggregation "
        "(node noise N(0, σ²C²) on the public grid, each prefix the sum of ≤ ⌈log2(T+1)⌉ nodes) and θ_t = θ_0 + "
        "η·(noisy prefix)/N (needs training.server_optimizer.name: fedavg, client_fraction 1, noise: server); ε is one "
        "Gaussian at σ/√K, K = Σ over the released nodes of (rounds in the node)²; banded: banded matrix factorisation "
        "(DP-FTRL with correlated noise, Choquette-Choo et al. 2023): round t releases x_t + ẑ_t, ẑ = C^{-1}z for the "
        "b-banded square-root strategy C, under the public cyclic schedule (training.sampling: cyclic, bands ≤ "
        "1/client_fraction); ε is one Gaussian at σ/sens, sens = √k·max‖C[:, i]‖, k = ⌈rounds·client_fraction⌉ "
        "(protocols/dp/banded_mf.py)",
    )
    bands: int | None = Field(
        None, ge=1, le=16,
        description="mechanism: banded — b, the strategy matrix's bands (the truncated square-root coefficients "
        "binom(2k,k)/4^k, k < b; b = 1 is independent noise without amplification); at most the participation period",
    )  # fmt: skip
    tree_restart_every: int | None = Field(
        None, ge=1, le=1_000_000,
        description="mechanism: tree — rounds per tree (a new tree, from zero noise, after each R rounds: the paper's "
        "restart); null: one tree over the run. With every client in every round K grows like (2/3)·R² a tree, so R = 1 "
        "is the plain Gaussian without sampling and larger R only adds ε; the tree pays off when each client is in "
        "few leaves of a tree",
    )  # fmt: skip

    @model_validator(mode="after")
    def _tree_options(self) -> ClientDPConfig:
        if self.tree_restart_every is not None and self.mechanism != "tree":
            raise ValueError("privacy.client.tree_restart_every applies to mechanism: tree only")
        if (self.bands is not None) != (self.mechanism == "banded"):
            raise ValueError("privacy.client.mechanism: banded needs privacy.client.bands, and bands applies to it only")
        if self.mechanism == "tree" and self.adaptive_clipping is not None:
            raise ValueError(
                "privacy.client.mechanism: tree with adaptive_clipping: a node's sensitivity is the clip norm of every round "
                "it sums, one fixed C; use one of the two"
            )
        if self.mechanism == "tree" and self.noise == "clients":
            raise ValueError(
                "privacy.client.mechanism: tree with noise: clients: the tree's node noise is drawn once by the server and "
                "reused by later prefix sums; clients' one-round shares cannot form it; use noise: server"
            )
        return self


class PrivacyConfig(_Strict):
    """Differential privacy settings; active only when ``dp`` is listed in ``protocols``. Each registered DP mechanism
    plugin adds its own sub-section ``privacy.<name>:`` (:mod:`protocols.dp.mechanism_plugins`; null: off)."""

    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    accountant: Literal["rdp", "prv", "pld"] = Field(
        "rdp",
        description="the accountant that stops and reports (rdp: Opacus RDP; prv: Opacus PRV; pld: dp-accounting's "
        "privacy-loss distribution); σ is calibrated by RDP, verified by PRV and by it",
    )
    report_gdp: bool = Field(
        False, description="also report Opacus's GDP ε (an approximation that can understate ε; never used to calibrate or stop)"
    )
    noise_seed: int | None = Field(
        None,
        description="debugging only: derive every DP noise and sampling draw, and the CKKS key holders' decryption "
        "noise, from this number, so runs repeat; the ε (and CKKS's protection of the key) then does not hold against "
        "anyone who knows it. Default: fresh secrets from os.urandom, kept in private checkpoints",
        json_schema_extra=SECRET,
    )
    instance: InstanceDPConfig | None = Field(
        None, description="instance unit: DP-SGD on the server's class-embedding update over label sets (fedalc)"
    )
    local: LocalDPConfig | None = Field(
        None, description="instance unit: DP-SGD inside client training (Opacus-style, per-sample clipping)"
    )
    client: ClientDPConfig | None = None
    over_bound: Literal["keep_hashed", "drop"] = Field(
        "keep_hashed",
        description="an instance with more labels than max_labels_per_instance: keep_hashed keeps the m labels whose keyed "
        "hash of (the instance, the label) is smallest (a rule of that instance alone); drop removes it from training",
    )

    def _bounds(self) -> dict[str, int]:
        """Every set sub-section's ``max_labels_per_instance`` (the units', and a mechanism plugin's that has one)."""
        subs = ((name, getattr(self, name)) for name in type(self).model_fields)
        return {
            name: u.max_labels_per_instance
            for name, u in subs
            if isinstance(u, BaseModel) and getattr(u, "max_labels_per_instance", None) is not None
        }

    def max_labels_per_instance(self) -> int | None:
        """The run's one contribution bound: the value the sub-sections give (they must agree), or None."""
        given = set(self._bounds().values())
        return given.pop() if given else None

    @model_validator(mode="after")
    def _one_bound(self) -> PrivacyConfig:
        given = self._bounds()
        if len(set(given.values())) > 1:
            listed = ", ".join(f"privacy.{n}.max_labels_per_instance {m}" for n, m in given.items())
            raise ValueError(f"{listed} differ: the bound decides which clients hold an instance, once a run; give one value")
        return self

    @model_validator(mode="after")
    def _one_instance_budget(self) -> PrivacyConfig:
        a = self.instance.target_epsilon if self.instance is not None else None
        b = self.local.target_epsilon if self.local is not None else None
        if a is not None and b is not None and a != b:
            raise ValueError(
                f"privacy.instance.target_epsilon {a:g} and privacy.local.target_epsilon {b:g} differ: both "
                "mechanisms spend the one budget of the instance unit; give it once (or twice the same)"
            )
        return self

    @model_validator(mode="after")
    def _noiseless_unit_has_no_budget(self) -> PrivacyConfig:
        """A noiseless block (noise_multiplier 0) makes its unit's ε ∞: no target in that unit can hold (the client
        unit is privacy.client; every other section, DP mechanism plugins included, spends the instance unit's)."""
        blocks = {n: b for n in type(self).model_fields if isinstance(b := getattr(self, n), BaseModel)}
        for unit, names in (("client", ["client"]), ("instance", [n for n in blocks if n != "client"])):
            zero = [n for n in names if getattr(blocks.get(n), "noise_multiplier", None) == 0.0]
            targets = [n for n in names if getattr(blocks.get(n), "target_epsilon", None) is not None]
            if zero and targets:
                raise ValueError(
                    f"privacy.{zero[0]}.noise_multiplier 0 (the noiseless control) makes the {unit} unit's ε ∞, so "
                    f"privacy.{targets[0]}.target_epsilon cannot hold: drop the target, or give σ > 0"
                )
        return self

    @field_validator("accountant", mode="before")
    @classmethod
    def _no_gdp(cls, v):
        if v == "gdp":
            raise ValueError(
                "gdp is an approximation that can understate ε (at σ 1.23, q 0.1, 50 steps: GDP 2.84 against PRV 3.53), "
                "so it may not calibrate σ or stop training; use rdp, prv or pld, and set privacy.report_gdp: true to see it"
            )
        return v


#: the built ``privacy:`` models, by the registered (plugin, settings model) pairs they were built from
_PRIVACY_MODELS: dict[tuple, type[PrivacyConfig]] = {}


def privacy_config_model() -> type[PrivacyConfig]:
    """The ``privacy:`` model of the DP mechanism plugins registered now: a subclass of :class:`PrivacyConfig` (what
    readers name: ``plan.part(PrivacyConfig)``) with one optional sub-section per plugin (``privacy.<name>:``, default
    null), its settings model."""
    from protocols.dp.mechanism_plugins import mechanism_specs

    owned = tuple((name, spec.settings) for name, spec in mechanism_specs().items())
    if owned not in _PRIVACY_MODELS:
        if clash := [name for name, _ in owned if name in PrivacyConfig.model_fields]:
            raise RuntimeError(f"DP mechanism plugins {clash} clash with the privacy section's own keys")
        fields: dict[str, Any] = {
            name: (model | None, Field(None, description=f"the {name} mechanism's settings (a DP mechanism plugin; null: off)"))
            for name, model in owned
        }
        _PRIVACY_MODELS[owned] = create_model("PrivacyConfig", __base__=PrivacyConfig, **fields)
    return _PRIVACY_MODELS[owned]


def __getattr__(name: str) -> Any:
    if name == "PrivacyConfigWithPlugins":  # the entry point's target: built when the config schema is
        return privacy_config_model()
    raise AttributeError(name)


class KeyedHashingConfig(_Strict):
    pseudonymize_labels: bool = Field(True, description="label pseudonyms HMAC(run key, 'label:'+name); rows in keyed order")


class SecureAggregationConfig(_Strict):
    threshold: float = Field(0.6, gt=0.0, le=1.0, description="t as a fraction of each client's neighbourhood (incl. itself)")
    neighbors: int | Literal["auto"] | None = Field(
        "auto",
        description="SecAgg+ neighbours per client: auto = the fewest that meet security_bits and correctness_bits "
        "for the round's cohort (protocols.secagg.graph_bounds; complete for small cohorts); a number k (the ring "
        "joins k // 2 on either side); "
        "null = complete graph (SecAgg)",
    )
    corrupt_fraction: float = Field(
        0.05, ge=0.0, lt=0.5, description="neighbors: auto — share of the federation's clients colluding with the server"
    )
    dropout_bound: float = Field(
        0.05,
        ge=0.0,
        lt=0.5,
        description="neighbors: auto — each client's chance to drop out in a round, independently (the larger of "
        "this and the simulated dropout's chance over the round's 4 stages is used)",
    )
    security_bits: float = Field(40.0, ge=1.0, le=128.0, description="neighbors: auto — privacy failure ≤ 2^-bits a round")
    correctness_bits: float = Field(20.0, ge=1.0, le=128.0, description="neighbors: auto — abort ≤ 2^-bits a round")
    graph_seed: int | None = Field(
        None,
        description="null: each round's neighbour graph comes from a secret the server draws (kept in its private "
        "checkpoint), so colluders fixed before the run cannot aim at a client; a number: a public graph, for debugging "
        "(the bounds then do not hold against colluders who know it)",
        json_schema_extra=SECRET,
    )
    clip_range: float = Field(1.0e4, gt=0.0, le=1e12, description="values are clipped to [-R, R] before fixed-point encoding")
    frac_bits: int = Field(24, ge=4, le=40, description="fixed-point fractional bits")
    modulus_bits: int = Field(
        64, ge=16, le=64, description="arithmetic modulo 2^bits; ≤ 32 uses 4-byte words (half the key stream and upload)"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="simulated probability that a client drops at each stage")
    fault_schedule: str | None = Field(
        None,
        description="a scripted fault schedule (YAML or JSON; protocols.secagg.fault_schedule): which nodes (client c "
        "on node c mod nodes) drop out at which SecAgg+ stage of which round; replaces the random dropout draws "
        "(setting both is an error)",
    )
    consistency_check: bool = Field(
        True,
        description="the active-server round before unmasking: each survivor signs the survivor set it was told, and "
        "a client releases a neighbour's share only when ⌈(|group| + t)/2⌉ of that neighbour's share holders signed "
        "the same set (a server that tells clients different dropout sets then needs t colluders in a group, as the "
        "graph bounds assume); false: a server that equivocates needs only 2t − (k+1) (protocols.secagg.signing)",
    )
    key_source: Literal["setup", "file"] = Field(
        "setup",
        description="where the clients' Ed25519 signing keys and the directory they pin come from. Trust assumption: "
        "setup = each client draws its key before round 0 and pins the directory assembled then (that one exchange "
        "must be honest: the operator acts as a trusted dealer); file = the operator wrote keys_dir "
        "(protocols.secagg.signing.write_keys_dir) and gave each client its own key file out of band",
    )
    keys_dir: str | None = Field(
        None, description="key_source: file — folder with directory.json and client-<id>.ed25519 (each client reads its own)"
    )

    @model_validator(mode="after")
    def _keys_dir_with_file(self) -> SecureAggregationConfig:
        if (self.key_source == "file") != (self.keys_dir is not None):
            raise ValueError("secure_aggregation.keys_dir is needed with key_source: file, and only then")
        return self

    @model_validator(mode="after")
    def _one_source_of_dropouts(self) -> SecureAggregationConfig:
        if self.fault_schedule is not None and self.dropout > 0:
            raise ValueError(
                f"secure_aggregation.fault_schedule and secure_aggregation.dropout {self.dropout:g} are both set: the "
                "schedule replaces the random dropout draws; set dropout: 0 or drop the schedule"
            )
        return self

    @field_validator("neighbors", mode="before")
    @classmethod
    def _auto_null_or_at_least_two(cls, v):
        if v is None or v == "auto":
            return v
        k = int(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v
        if isinstance(k, bool) or not isinstance(k, int):
            raise ValueError("give a whole number of neighbours (at least 2), auto, or null (complete graph)")
        if k < 2:
            raise ValueError(f"{k} neighbours cannot connect a cohort; give at least 2, auto, or null (complete graph)")
        return k


#: the least std of the key holders' decryption noise in the decryption polynomial's coefficients: 20 × the std
#: (3.19) of the ring-LWE error in the public key, which the server already holds
DECRYPTION_NOISE_FLOOR = 64.0


class CKKSConfig(_Strict):
    poly_modulus_degree: int = Field(8192, description="power of two, ≥ 4096")
    coeff_mod_bit_sizes: list[int] = Field(default_factory=lambda: [60, 40, 40, 60])
    global_scale_bits: int = Field(40, ge=20, le=60, description="global scale 2^bits")
    key_holders: int = Field(3, ge=1, description="clients (smallest ids) that hold the secret key and decrypt sums")
    encrypt: list[str] = Field(
        default_factory=lambda: ["all"],
        description="parameter groups to encrypt: 'all', 'theta', 'rows', or θ parameter-name prefixes; the rest is plaintext",
    )
    row_blocks: Literal["own", "all"] = Field(
        "own",
        description="own: a client encrypts only the ciphertexts that hold the rows the server sent it (and every "
        "dense group); all: every ciphertext. A reply with a value on every row (a DP noise share) sends all",
    )
    decryption_noise: float = Field(
        2.0**-26,
        gt=0.0,
        le=1.0,
        description="std σ of the Gaussian noise a key holder adds, from its own secret, to every decrypted value it "
        "returns (exact decryptions of two rounds give the server the secret key: threat_models/ckks_key_recovery.py); "
        f"at least {DECRYPTION_NOISE_FLOOR:g} in the decryption polynomial's coefficients (2^global_scale_bits·σ/√N)",
    )

    @model_validator(mode="after")
    def _power_of_two(self) -> CKKSConfig:
        n = self.poly_modulus_degree
        if n < 4096 or n & (n - 1):
            raise ValueError(f"ckks.poly_modulus_degree must be a power of two ≥ 4096, got {n}")
        return self

    @staticmethod
    def _is_prime(p: int) -> bool:
        """Deterministic Miller–Rabin for p < 2^64 (the first 12 prime bases)."""
        bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
        if p < 2:
            return False
        for b in bases:
            if p % b == 0:
                return p == b
        d, s = p - 1, 0
        while d % 2 == 0:
            d, s = d // 2, s + 1
        for b in bases:
            x = pow(b, d, p)
            if x in (1, p - 1):
                continue
            for _ in range(s - 1):
                x = x * x % p
                if x == p - 1:
                    break
            else:
                return False
        return True

    @classmethod
    def _primes_found(cls, bits: int, n: int, want: int) -> int:
        """How many (up to ``want``) primes p ≡ 1 (mod 2n) with 2^(bits−1) < p < 2^bits exist: SEAL's
        ``CoeffModulus::Create`` needs one per entry of that bit size (it searches down from 2^bits − 2n + 1)."""
        found, p = 0, (1 << bits) - 2 * n + 1
        while p > 1 << (bits - 1) and found < want:
            found += cls._is_prime(p)
            p -= 2 * n
        return found

    @model_validator(mode="after")
    def _modulus_chain(self) -> CKKSConfig:
        """The chains TenSEAL (SEAL 4) refuses when the run builds its context or encrypts, refused here instead.

        The layer only adds ciphertexts (no multiplication, so no rescaling): one data level is all it needs."""
        n, bits, scale = self.poly_modulus_degree, list(self.coeff_mod_bit_sizes), self.global_scale_bits
        if n < 4096 or n & (n - 1):
            return self  # _power_of_two says why
        # SEAL's CoeffModulus::MaxBitCount at 128-bit security (the HE standard); no entry above 32768
        max_bits = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
        name = f"ckks.coeff_mod_bit_sizes {bits}"
        if n not in max_bits:
            raise ValueError(f"ckks.poly_modulus_degree {n}: SEAL has no 128-bit-secure modulus for it; use 4096-32768")
        if len(bits) < 2:
            raise ValueError(f"{name}: give at least 2 primes (the data primes, then the special prime key switching "
                             "needs; TenSEAL refuses a single prime)")  # fmt: skip
        if bad := [b for b in bits if not 2 <= b <= 60]:
            raise ValueError(f"{name}: each prime has 2 to 60 bits (SEAL), got {bad}")
        if sum(bits) > max_bits[n]:
            raise ValueError(f"{name} total {sum(bits)} bits, above SEAL's 128-bit-security limit of {max_bits[n]} for "
                             f"poly_modulus_degree {n}")  # fmt: skip
        if sum(bits[:-1]) < scale + 2:
            raise ValueError(f"{name}: the data primes (all but the last) total {sum(bits[:-1])} bits; SEAL encodes at "
                             f"global_scale_bits {scale} only below {scale + 2} (scale + 1 < data bits)")  # fmt: skip
        for b in sorted(set(bits)):
            want = bits.count(b)
            if (got := self._primes_found(b, n, want)) < want:
                raise ValueError(f"{name}: SEAL needs {want} distinct {b}-bit primes ≡ 1 mod {2 * n} and there "
                                 f"{'is' if got == 1 else 'are'} {got}; use larger primes")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _noise_floor(self) -> CKKSConfig:
        # slot noise of std σ is noise of std Δσ/√N in each coefficient of the polynomial the server would solve for
        coeff = 2.0**self.global_scale_bits * self.decryption_noise / self.poly_modulus_degree**0.5
        if coeff < DECRYPTION_NOISE_FLOOR:
            need = DECRYPTION_NOISE_FLOOR * self.poly_modulus_degree**0.5 / 2.0**self.global_scale_bits
            raise ValueError(
                f"ckks.decryption_noise {self.decryption_noise:g} is {coeff:.3g} in the decryption polynomial's "
                f"coefficients at global_scale_bits {self.global_scale_bits}, below {DECRYPTION_NOISE_FLOOR:g} (20 × the "
                f"public key's own error): raise it to at least {need:.3g}"
            )
        return self
