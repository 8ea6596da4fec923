"""``one_run_audit``: its spec and settings, and the canaries it inserts during training (light: ``secure-fed list``
and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.one_run_audit`; the canaries: :mod:`threat_models.canaries`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from protocols.config_sections import PrivacyConfig
from secure_fed.plugin_api.attacks import AttackSpec, ConfigError
from threat_models.recorder import Recorder

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan


class OneRunAuditConfig(BaseModel):
    """``attacks.one_run_audit:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

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


def records(settings: OneRunAuditConfig, plan: RunPlan, exp) -> Recorder | None:
    """The Dirac canaries, inserted into the owner clients' updates (or, under DP-SGD in client training, as
    gradient canaries of norm C: the canaries are then instances), kept in ``auditor.pt``."""
    if settings.canaries <= 0:
        return None
    import numpy as np

    from threat_models.canaries import DiracCanaries

    dp = "dp" in plan.protocols
    privacy = plan.part(PrivacyConfig)
    client = privacy.client if dp else None
    local = privacy.local if dp else None
    unit = "instance" if local is not None else "client"
    norm = settings.canary_norm or (local.clip_norm if local is not None else client.clip_norm if client else 0.05)
    # the trained tensors: θ's (a fixed encoder's are not), and under DP-SGD in the positive-only setting the owner's
    # class row (each client trains its one row)
    trained = {n for n, p in exp.model.encoder.named_parameters() if p.requires_grad}
    rows = None
    if unit == "instance" and exp.W is not None and plan.partition.name == "positive_only":
        if "keyed_hashing" in plan.protocols:
            raise ConfigError(f"{SPEC.name} under privacy.local with keyed_hashing: row canaries need each client's row "
                              "in the released W's order; audit without keyed_hashing")  # fmt: skip
        owner_row = [int(c.known_labels[0]) for c in exp.fed.clients]
        rows = (np.asarray(owner_row), exp.W.detach().double().cpu().numpy())
    canaries = DiracCanaries(
        m=settings.canaries, norm=norm, num_clients=len(exp.fed.clients),
        theta_shapes={n: tuple(t.shape) for n, t in exp.theta.items() if n in trained}, unit=unit, own_rows=rows,
    )  # fmt: skip
    # client canaries ride on the owner's update; instance canaries enter through its DP-SGD privatizer
    return Recorder(secrets=canaries, file="auditor.pt", key="canaries", wraps_clients=unit == "client")


def headline(entry) -> str:
    m = entry["metrics"]
    vacuous = " — vacuous: no outcome could give a bound > 0" if m.get("vacuous") else ""
    return (
        f"ε lower bound {m['epsilon_lower_bound']:.3f} ≤ ε {m['replacement_epsilon']} at the audit's δ "
        f"(ledger ε {m['accountant_epsilon']}){vacuous}"
    )


SPEC = AttackSpec(
    name="one_run_audit",
    role="auditor",
    needs="canaries inserted during training (attacks.one_run_audit.canaries > 0), θ⁰ and the released θ",
    defended_by="dp (privacy.client)",
    description="Steinke et al. one-run audit with Dirac canaries: an empirical ε lower bound at 95% confidence "
    "(and a GDP μ lower bound)",
    scores={"epsilon_lower_bound": "ε lower bound", "gdp_mu_lower_bound": "μ lower bound"},
    implementation="threat_models.attacks.one_run_audit:OneRunAudit",
    settings=OneRunAuditConfig,
    records=records,
    headline=headline,
)
