"""``token_linkage``: its spec and settings (light: ``secure-fed list`` and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.token_linkage`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_api.attacks import AttackSpec


class TokenLinkageConfig(BaseModel):
    """``attacks.token_linkage:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    pool_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="fraction of the training instances in the attacker's candidate pool"
    )
    distractors: int = Field(2000, ge=0, description="non-training candidates (test-split instances) added to the pool")


def headline(entry) -> str:
    m, c = entry["metrics"], entry["chance"]
    return f"linked {m['linked']:.3f} (chance {c['linked']:.1e}), precision {m['precision']:.3f}"


SPEC = AttackSpec(
    name="token_linkage",
    role="server",
    needs="the label-set replies it received; a candidate pool holding part of the training instances plus distractors",
    defended_by="keyed_hashing",
    description="recompute public SHA-256 tokens of candidate instances and link them to label sets and clients; "
    "reports the linked fraction of training instances and the precision of the links",
    scores={"linked": "linked", "precision": "precision"},
    implementation="threat_models.attacks.token_linkage:TokenLinkage",
    settings=TokenLinkageConfig,
    headline=headline,
)
