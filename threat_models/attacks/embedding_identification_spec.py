"""``embedding_identification``: its spec (light: ``secure-fed list`` and ``validate`` import no attack). It takes no
settings.

The attack: :mod:`threat_models.attacks.embedding_identification`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from secure_fed.plugin_api.attacks import AttackSpec

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import DataShape, RunPlan


def memory_bytes(shape: DataShape, plan: RunPlan) -> float:
    """The test labels as a dense bool matrix and per-label centroids of g(x)."""
    rows = shape.test if plan.evaluation.max_test is None else min(shape.test, plan.evaluation.max_test)
    return rows * shape.labels + 2 * 4 * shape.labels * plan.model.embedding_dim


def headline(entry) -> str:
    m, c = entry["metrics"], entry["chance"]
    return f"top-1 {m['top1']:.3f}, top-5 {m['top5']:.3f} (chance {c['top1']:.4f} / {c['top5']:.4f})"


SPEC = AttackSpec(
    name="embedding_identification",
    role="server",
    needs="θ and the W rows (or one client's row); auxiliary labelled data (the public test split)",
    defended_by="dp (privacy.client)",
    description="name each class-embedding row by its similarity to public per-label centroids of g(x); reports "
    "top-1 and top-5 accuracy",
    scores={"top1": "top-1", "top5": "top-5"},
    implementation="threat_models.attacks.embedding_identification:EmbeddingIdentification",
    memory=memory_bytes,
    headline=headline,
)
