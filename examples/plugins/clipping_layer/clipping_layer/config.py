"""The layer's own YAML section, ``clipping:`` (registered as ``secure_fed.config_sections``: ``clipping``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClippingSection(BaseModel):
    """``clipping: {max_norm: ...}``: the L2 bound of one client's whole update (Δθ and its row deltas, as one
    vector). Unknown keys, a non-positive or non-finite bound are refused."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    max_norm: float = Field(1.0, gt=0.0, description="L2 bound of each client's update (clipping layer)")
