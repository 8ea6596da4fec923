"""The YAML sections the protocol layers own: ``privacy``, ``keyed_hashing``, ``secure_aggregation``, ``ckks``.

Pydantic models only (no torch): they register with the core's schema through the
``secure_fed.config_sections`` entry points, so ``secure-fed validate`` checks them without
importing a layer.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class _DPUnitConfig(_Strict):
    clip_norm: float = Field(1.0, gt=0.0, le=1e12, description="L2 clipping bound C (per privacy unit's contribution)")
    noise_multiplier: float | None = Field(
        None, gt=0.0, le=1e6, description="σ; noise std is σ·C. Omit to calibrate from target_epsilon"
    )
    target_epsilon: float | None = Field(
        None, gt=0.0, le=1e6, description="budget: calibrates σ if noise_multiplier is unset; enforced"
    )


class InstanceDPConfig(_DPUnitConfig):
    """DP-SGD on the server's class-embedding update (FedALC eq. 11, FedALC-fixed eq. 12); the unit is a label set."""

    sample_rate: float = Field(0.1, gt=0.0, le=1.0, description="q: Poisson sampling rate of label sets per server step")


class LocalDPConfig(_DPUnitConfig):
    """DP-SGD inside each client's local training (per-sample gradients, per-sample clipping to C, Gaussian noise
    σ·C on each step's sum, Poisson-sampled batches); its steps join the instance unit's ledger."""

    batch_sample_rate: float = Field(
        0.25, gt=0.0, le=1.0,
        description="q: each local step takes every example of the client independently with probability q "
        "(Poisson sampling, from the client's own secret); a local epoch is round(1/q) steps",
    )  # fmt: skip


class ClientDPConfig(_DPUnitConfig):
    """DP-FedAvg: each client's whole update (θ and its rows) clipped to C, Gaussian noise on the sum."""

    noise: Literal["server", "clients"] = Field(
        "server",
        description="server: the server adds N(0, σ²C²) to the sum (trusted with the un-noised sum); clients: each "
        "client adds N(0, σ²C²/t) before a secure sum of ≥ t updates (needs secure_aggregation or ckks)",
    )
    weight_cap: float | None = Field(
        None, gt=0.0, le=1e12,
        description="algorithms whose clients report an aggregation weight computed from their data (flag, eq. 2): "
        "the public bound W̄; each client scales its clipped update by min(w, W̄)/W̄ ≤ 1 and reports weight 1, so the "
        "sensitivity stays C and no weight leaves the client outside the DP-protected update (required for flag)",
    )  # fmt: skip


class PrivacyConfig(_Strict):
    """Differential privacy settings; active only when ``dp`` is listed in ``protocols``."""

    delta: float = Field(1e-5, gt=0.0, lt=1.0)
    accountant: Literal["rdp", "prv"] = Field("rdp", description="the accountant that calibrates σ, stops and reports")
    report_gdp: bool = Field(
        False, description="also report Opacus's GDP ε (an approximation that can understate ε; never used to calibrate or stop)"
    )
    noise_seed: int | None = Field(
        None,
        description="debugging only: derive every DP noise and sampling draw, and the CKKS key holders' decryption "
        "noise, from this number, so runs repeat; the ε (and CKKS's protection of the key) then does not hold against "
        "anyone who knows it. Default: fresh secrets from os.urandom, kept in private checkpoints",
    )
    instance: InstanceDPConfig | None = Field(
        None, description="instance unit: DP-SGD on the server's class-embedding update over label sets (fedalc)"
    )
    local: LocalDPConfig | None = Field(
        None, description="instance unit: DP-SGD inside client training (Opacus-style, per-sample clipping)"
    )
    client: ClientDPConfig | None = None

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
    )
    clip_range: float = Field(1.0e4, gt=0.0, le=1e12, description="values are clipped to [-R, R] before fixed-point encoding")
    frac_bits: int = Field(24, ge=4, le=40, description="fixed-point fractional bits")
    modulus_bits: int = Field(
        64, ge=16, le=64, description="arithmetic modulo 2^bits; ≤ 32 uses 4-byte words (half the key stream and upload)"
    )
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="simulated probability that a client drops at each stage")

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
