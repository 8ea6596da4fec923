"""``canary_client_audit``: its spec and settings, and the canary clients it inserts during training (light:
``secure-fed list`` and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.canary_client_audit`; the canary clients: :mod:`threat_models.canary_clients`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from protocols.config_sections import PrivacyConfig
from secure_fed.plugin_api.attacks import AttackSpec, ConfigError
from threat_models.recorder import Recorder

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan

#: ``canaries: auto``: this many canary clients, or a quarter of the run's clients when that is fewer
AUTO_CANARY_CLIENTS = 20


class CanaryClientAuditConfig(BaseModel):
    """``attacks.canary_client_audit:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

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


def records(settings: CanaryClientAuditConfig, plan: RunPlan, exp) -> Recorder | None:
    """The canary clients (client-level DP's audit: none under DP-SGD in client training, whose unit is the
    instance), in θ's trained tensors, of norm ``canary_norm`` or else privacy.client.clip_norm, kept in
    ``auditor_canary_clients.pt``. A canary client's reply is its canary alone: it wraps outside other insertions."""
    if settings.canaries == 0:
        return None
    num_clients = len(exp.fed.clients)
    count = min(AUTO_CANARY_CLIENTS, num_clients // 4) if settings.canaries == "auto" else settings.canaries
    if count == 0:
        return None  # too few clients for auto: the audit reports it skipped (no canary clients were inserted)
    dp = "dp" in plan.protocols
    privacy = plan.part(PrivacyConfig)
    if dp and privacy.local is not None:
        return None
    client = privacy.client if dp else None
    norm = settings.canary_norm or (client.clip_norm if client is not None else 0.05)
    trained = {n for n, p in exp.model.encoder.named_parameters() if p.requires_grad}
    if count > num_clients:
        raise ConfigError(f"attacks.{SPEC.name}.canaries = {count}: at most the run's {num_clients} clients")
    from threat_models.canary_clients import CanaryClients

    clients = CanaryClients(c=count, held_out=settings.held_out, norm=norm, num_clients=num_clients,
                            theta_shapes={n: tuple(t.shape) for n, t in exp.theta.items() if n in trained})  # fmt: skip
    return Recorder(secrets=clients, file="auditor_canary_clients.pt", key="canary_clients", outermost=True)


SPEC = AttackSpec(
    name="canary_client_audit",
    role="auditor",
    needs="canary clients inserted during training (attacks.canary_client_audit.canaries > 0), θ⁰ and the released θ",
    defended_by="dp (privacy.client)",
    description="Andrew et al. one-shot estimate: ε of the Gaussians fitted to inserted vs held-out canary clients' "
    "cosines with the final model delta (an estimate, not a bound), with a bootstrap interval",
    scores={"epsilon_estimate": "ε", "epsilon_estimate_ci95": "interval"},
    implementation="threat_models.attacks.canary_client_audit:CanaryClientAudit",
    settings=CanaryClientAuditConfig,
    records=records,
)
