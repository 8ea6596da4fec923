"""``label_deanonymization``: its spec and settings (light: ``secure-fed list`` and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.label_deanonymization`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_api.attacks import AttackSpec

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import DataShape, RunPlan


class LabelDeanonymizationConfig(BaseModel):
    """``attacks.label_deanonymization:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    iterations: int = Field(30, ge=0, description="co-occurrence refinement rounds after the frequency seed")


def memory_bytes(shape: DataShape, plan: RunPlan) -> float:
    """The label sets densified (float32, at most one per training instance), the public test labels (int8) and
    four C × C float64 co-occurrence profiles (its matching and scoring are over dense label vectors)."""
    C = shape.labels
    return shape.train * C * 4 + shape.test * C + 4 * 8 * C * C


def headline(entry) -> str:
    m, c = entry["metrics"], entry["chance"]
    return f"re-identified {m['reidentified']:.3f} (chance {c['reidentified']:.4f}), top-5 {m['reidentified_top5']:.3f}"


SPEC = AttackSpec(
    name="label_deanonymization",
    role="server",
    needs="the merged label sets (rows = W rows); public label co-occurrence from a disjoint split",
    defended_by="none fully: keyed_hashing pseudonyms hide names only up to co-occurrence structure",
    description="match pseudonymised W rows to label names by frequency and co-occurrence graph matching; reports "
    "the re-identified fraction of rows (top-1 and top-5)",
    scores={"reidentified": "re-identified", "reidentified_top5": "top-5"},
    implementation="threat_models.attacks.label_deanonymization:LabelDeanonymization",
    memory=memory_bytes,
    settings=LabelDeanonymizationConfig,
    headline=headline,
)
