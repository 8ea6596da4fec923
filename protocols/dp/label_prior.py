"""``label_prior``: a DP histogram of the training labels, released once before round 0 (a DP mechanism plugin,
:mod:`protocols.dp.mechanism_plugins`; its section ``privacy.label_prior:``).

Each client counts, from its own data, how many of its instances hold each of its labels; an instance counts at most
once per label (its label vector is 0/1) and its whole contribution is bounded in L2 by √m, m =
``max_labels_per_instance`` (an instance with more labels on one client is scaled down to norm √m; in the
positive_only partition, where an instance sits on one client per label, the run bounds every instance to m labels
before the partition, so its counts over all clients have norm ≤ √m). With ``privacy.client`` each client's whole
vector is clipped in L2 to ``client_clip_norm``. The server sums the vectors and releases the sum with discrete
Gaussian noise of std σ·√m (:func:`protocols.dp.discrete_gaussian.noisy_sum`), one step at q = 1 in the instance
unit's ledger (and the client unit's, at σ·√m / client_clip_norm): the label prior that an algorithm asks for as the
statistic ``label_counts`` (``algorithm.name: label_prior`` scores every instance by it).

Light on import (pydantic): the client side imports torch when it runs.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from protocols.dp.mechanism_plugins import MechanismSpec


class LabelPriorSettings(BaseModel):
    """``privacy.label_prior``: the DP label histogram."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    noise_multiplier: float | None = Field(
        None, gt=0.0, le=1e6,
        description="σ: the noise std is σ·√m (m: max_labels_per_instance); omit to calibrate it from target_epsilon",
    )  # fmt: skip
    target_epsilon: float | None = Field(
        None, gt=0.0, le=1e6,
        description="the instance unit's budget (its one target, with privacy.instance / privacy.local): calibrates σ "
        "when noise_multiplier is unset",
    )  # fmt: skip
    max_labels_per_instance: int = Field(
        ..., ge=1, le=1_000_000,
        description="m: an instance counts for at most m labels (L2 norm ≤ √m, the instance sensitivity); in the "
        "positive_only partition the run's contribution bound (privacy.*.max_labels_per_instance: the same value)",
    )  # fmt: skip
    client_clip_norm: float = Field(
        1.0, gt=0.0, le=1e12,
        description="with privacy.client: each client's count vector is clipped to this L2 norm (the client sensitivity)",
    )  # fmt: skip


def sensitivity(section: LabelPriorSettings, unit: str) -> float:
    """L2 sensitivity of the summed counts: √m per instance, the clip norm per client."""
    return math.sqrt(section.max_labels_per_instance) if unit == "instance" else float(section.client_clip_norm)


def label_counts(data, *, instance_bound: float, client_clip: float | None):
    """Client side: this client's label counts (length C) from its own instances, each instance's 0/1 label vector
    scaled to L2 norm ≤ ``instance_bound``, the whole vector clipped to ``client_clip`` where given."""
    import torch

    pos = data.pos.to(torch.float64).cpu()
    norms = torch.linalg.vector_norm(pos, dim=1)
    scale = torch.where(norms > instance_bound, instance_bound / norms.clamp_min(1e-300), torch.ones_like(norms))
    counts = torch.zeros(int(data.num_labels), dtype=torch.float64)
    counts[data.known_labels.long().cpu()] = (pos * scale[:, None]).sum(0)
    if client_clip is not None:
        norm = float(torch.linalg.vector_norm(counts))
        if norm > client_clip:
            counts = counts * (client_clip / norm)
    return counts


SPEC = MechanismSpec(
    name="label_prior",
    settings=LabelPriorSettings,
    statistic="label_counts",
    client="protocols.dp.label_prior:label_counts",
    sensitivity=sensitivity,
    client_clip=lambda section: float(section.client_clip_norm),
    description="a DP histogram of the training labels (each instance's counts bounded to L2 √m), released once",
)
