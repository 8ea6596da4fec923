"""The ``attacks:`` YAML section (owned by ``threat_models``; registered with the core's schema through the
``secure_fed.config_sections`` entry points). Pydantic only: validating a config imports no attack."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from secure_fed.errors import unknown_name
from secure_fed.plugin_specs import attack_specs


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class TokenLinkageConfig(_Strict):
    pool_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="fraction of the training instances in the attacker's candidate pool"
    )
    distractors: int = Field(2000, ge=0, description="non-training candidates (test-split instances) added to the pool")


class LabelDeanonymizationConfig(_Strict):
    iterations: int = Field(30, ge=0, description="co-occurrence refinement rounds after the frequency seed")


class MembershipInferenceConfig(_Strict):
    shadows: int = Field(
        16,
        ge=0,
        description="shadow runs on random halves of the target pool, for LiRA and RMIA (online and offline; 0: LOSS only)",
    )
    bootstrap: int = Field(200, ge=10, description="bootstrap resamples for the AUC confidence interval")
    shadow_dir: str | None = Field(None, description="where shadow runs are cached (default RUN_DIR/shadows)")
    shadow_cohort: int = Field(
        16, ge=1, description="shadow runs trained together as one vectorised cohort, clients batched (1: one after another)"
    )
    rmia_offline_a: float = Field(
        0.3, ge=0.0, le=1.0, description="offline RMIA's slope a: Pr(x) ≈ ½((1+a)·Pr_OUT(x) + (1−a)) (ML Privacy Meter's default)"
    )
    rmia_gamma: float = Field(1.0, gt=0.0, description="RMIA's pairwise threshold γ on (Pr(x|θ)/Pr(x)) / (Pr(z|θ)/Pr(z))")


class OneRunAuditConfig(_Strict):
    canaries: int = Field(1000, ge=0, description="m Dirac canaries in θ, each inserted with probability ½ (0: off)")
    canary_norm: float | None = Field(None, gt=0.0, description="size of a canary; default privacy.client.clip_norm, else 0.05")
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    reference: Literal["initial", "noise_free_replay"] = Field(
        "initial",
        description="what a canary's coordinate is compared with: initial (θ⁰, W⁰: the data's own update stays in the "
        "score) or noise_free_replay (the auditor, who knows every other training instance as DP's adversary may, "
        "replays the run without canaries and with negligible noise, σ = 1e-9, and subtracts its model: the score is "
        "then the canary plus the noise; exact for a run whose sampling does not depend on secrets, e.g. full batches)",
    )


class CanaryClientAuditConfig(_Strict):
    canaries: int | Literal["auto"] = Field(
        "auto", description="c of the run's clients made canary clients: each sampled one sends its canary, a random "
        "unit direction in θ scaled to canary_norm, in place of its update (0: off; auto: min(20, a quarter of the "
        "run's clients))",
    )  # fmt: skip

    @field_validator("canaries")
    @classmethod
    def _non_negative(cls, v):
        if v != "auto" and v < 0:
            raise ValueError("give a count ≥ 0 (0: off) or auto")
        return v

    held_out: int = Field(200, ge=2, description="random directions never inserted: the null of the cosines")
    canary_norm: float | None = Field(
        None, gt=0.0, description="the canaries' L2 norm; default privacy.client.clip_norm, else 0.05"
    )


class UpdateInversionConfig(_Strict):
    targets: int = Field(10, ge=1, description="clients of the captured round whose updates are attacked")


class GradientInversionConfig(_Strict):
    targets: int = Field(4, ge=1, description="clients of the captured round whose images are reconstructed")
    steps: int = Field(300, ge=1, le=100_000, description="Adam steps on the dummy images")
    lr: float = Field(0.1, gt=0.0, description="Adam's step size (decayed ×0.1 at 3/8, 5/8 and 7/8 of the steps)")
    tv: float = Field(1e-2, ge=0.0, description="weight of the total-variation prior")
    max_images: int = Field(8, ge=1, le=64, description="dummy images per target at most (else the target's row count)")


class AttacksConfig(_Strict):
    """Attacks and audits (``threat_models``) run on the finished run; ``secure-fed list`` shows them."""

    run: list[str] = Field(default_factory=list, description="attack names; [all] for every registered attack")
    token_linkage: TokenLinkageConfig = TokenLinkageConfig()
    label_deanonymization: LabelDeanonymizationConfig = LabelDeanonymizationConfig()
    membership_inference: MembershipInferenceConfig = MembershipInferenceConfig()
    one_run_audit: OneRunAuditConfig = OneRunAuditConfig()
    canary_client_audit: CanaryClientAuditConfig = CanaryClientAuditConfig()
    update_inversion: UpdateInversionConfig = UpdateInversionConfig()
    gradient_inversion: GradientInversionConfig = GradientInversionConfig()

    @model_validator(mode="after")
    def _known(self) -> AttacksConfig:
        specs = attack_specs()
        for name in self.run:
            if name != "all" and name not in specs:
                raise ValueError(unknown_name("attack", name, specs))
        return self

    def names(self) -> list[str]:
        """The attacks to run, in registry order for ``[all]``."""
        return list(attack_specs()) if "all" in self.run else list(dict.fromkeys(self.run))

    #: the memory estimate's hint for an attack's term that is too large (:mod:`secure_fed.memory`)
    memory_hint: ClassVar[str] = ": leave it out of attacks.run for data of this size"

    def memory_phases(self, cfg, shape) -> dict[str, float]:
        """The configured attacks' own peaks for the memory estimate, one phase each (``AttackSpec.memory``, if any)."""
        specs = attack_specs()
        chosen = [n for n in self.names() if n in specs and specs[n].memory is not None]
        return {f"attack {n}": float(specs[n].memory(shape, cfg)) for n in chosen}
