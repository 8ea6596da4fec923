"""``gradient_inversion``: its spec and settings, and the whole uplinks it needs recorded during training (light:
``secure-fed list`` and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.gradient_inversion`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_api.attacks import AttackSpec
from threat_models.recorder import Recorder

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan


class GradientInversionConfig(BaseModel):
    """``attacks.gradient_inversion:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    targets: int = Field(4, ge=1, description="clients of the captured round whose images are reconstructed")
    steps: int = Field(300, ge=1, le=100_000, description="Adam steps on the dummy images")
    lr: float = Field(0.1, gt=0.0, description="Adam's step size (decayed ×0.1 at 3/8, 5/8 and 7/8 of the steps)")
    tv: float = Field(1e-2, ge=0.0, description="weight of the total-variation prior")
    max_images: int = Field(8, ge=1, le=64, description="dummy images per target at most (else the target's row count)")


def records(settings, plan: RunPlan, exp) -> Recorder:
    """Whole uplinks of the captured round and θ at its start (the updates are matched in every parameter)."""
    return Recorder(whole_uplinks=True)


SPEC = AttackSpec(
    name="gradient_inversion",
    role="server",
    needs="image data; whole uplinks of one round and θ as sent (recorded when configured before training); "
    "the public architecture, loss and preprocessing; for a batch > 1 the target's labels (given); public images",
    defended_by="dp (noise the server cannot remove: privacy.local (DP-SGD) or privacy.client.noise: clients) or "
    "secure_aggregation / ckks",
    description="Geiping et al. 2020: images whose gradient matches a client's update in cosine, with a TV prior; PSNR/SSIM",
    scores={"psnr": "PSNR", "ssim": "SSIM"},
    implementation="threat_models.attacks.gradient_inversion:GradientInversion",
    settings=GradientInversionConfig,
    records=records,
)
