"""``update_inversion``: its spec and settings (light: ``secure-fed list`` and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.update_inversion`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_api.attacks import AttackSpec


class UpdateInversionConfig(BaseModel):
    """``attacks.update_inversion:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    targets: int = Field(10, ge=1, description="clients of the captured round whose updates are attacked")


def headline(entry) -> str:
    m, c = entry["metrics"], entry["chance"]
    ind = m.get("individual")
    s = f"individual F1 {ind['f1']:.3f}, " if ind else ""
    return s + f"aggregate F1 {m['aggregate']['f1']:.3f} (no-update guess {c['f1']:.3f})"


SPEC = AttackSpec(
    name="update_inversion",
    role="server",
    needs="the uplinks of one round as they cross the wire (the last round run); public feature frequencies",
    defended_by="secure_aggregation or ckks (the server gets only the cohort's sum)",
    description="recover each client's vocabulary from the first-layer columns its update touches; reports the F1 "
    "of the recovered words",
    scores={"f1": "F1"},
    implementation="threat_models.attacks.update_inversion:UpdateInversion",
    settings=UpdateInversionConfig,
    headline=headline,
)
