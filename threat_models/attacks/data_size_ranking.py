"""``data_size_ranking`` (server): how much data each client holds, guessed from the norm of its update.

The honest-but-curious server ranks the clients of its one recorded round by the L2 norm of their update, as it
crossed the wire: a client with more instances takes more local steps in an epoch, so its update tends to be larger.
The guess is scored by Spearman's ρ between that ranking and the clients' true sizes (chance: 0; a ρ near 0 can
also mean that the local recipe does not scale with the data, e.g. a fixed number of steps). With ``parameters:
first`` the norm is over θ's first parameter, which the server's tap records in every audited run; with ``parameters:
all`` it is over every parameter, whose whole uplinks the attack asks to be recorded during training (its spec's
``records``). Under ``secure_aggregation`` or ``ckks`` the server holds the cohort's sum only and the attack reports
itself skipped; ``dp`` (``privacy.client``) clips every update to norm ≤ ``clip_norm``, which ties the clipped ones
and weakens the ranking without stopping it (the default config at 20 rounds, ``parameters: all``: ρ 0.91 without
``dp``, 0.29 with ``privacy.client = {noise_multiplier: 1.0, clip_norm: 0.1}``).

The spec, the settings and the attack are this one module, registered by one entry point; the spec's part imports
no torch (the attack reads tensors through their methods).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_api.attacks import AttackSpec
from threat_models.base import Attack, AttackResult
from threat_models.recorder import Recorder

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan


class DataSizeRankingConfig(BaseModel):
    """``attacks.data_size_ranking:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    parameters: Literal["first", "all"] = Field(
        "first",
        description="the update's norm over θ's first parameter (always recorded) or over all of θ (whole uplinks, "
        "then recorded during training)",
    )
    min_clients: int = Field(3, ge=2, description="fewest plaintext uplinks in the captured round to rank (else skipped)")


def records(settings: DataSizeRankingConfig, plan: RunPlan, exp) -> Recorder | None:
    """Whole uplinks when the norm is over every parameter; the tap's first parameter otherwise."""
    return Recorder(whole_uplinks=True) if settings.parameters == "all" else None


def headline(entry) -> str:
    m, c, d = entry["metrics"], entry["chance"], entry["details"]
    return f"Spearman ρ {m['spearman']:.3f} (chance {c['spearman']:.1f}) over {d['clients']} clients ({d['parameters']} of θ)"


SPEC = AttackSpec(
    name="data_size_ranking",
    role="server",
    needs="the plaintext uplinks of one round (the last round run; whole uplinks with parameters: all); nothing else",
    defended_by="secure_aggregation or ckks (the server gets only the cohort's sum); dp (privacy.client) clipping only "
    "weakens it",
    description="rank the clients of a round by the norm of their update as a guess of their data sizes; reports "
    "Spearman's ρ between the ranking and the true sizes",
    scores={"spearman": "Spearman's ρ"},
    implementation="threat_models.attacks.data_size_ranking:DataSizeRanking",
    settings=DataSizeRankingConfig,
    records=records,
    headline=headline,
)


def average_ranks(x) -> np.ndarray:
    """Ranks from 0, ties sharing their mean rank (Spearman's ρ is Pearson's r of these)."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x), dtype=float)
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def spearman(a, b) -> float:
    """Spearman's ρ; 0 where either side is constant (no ranking to agree with)."""
    ra, rb = average_ranks(a), average_ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


class DataSizeRanking(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        cap = None if ctx.tap is None else ctx.tap.capture
        if cap is None:
            return "the run recorded no round of uplinks (set attacks.run before training)"
        if cap["individual"] is None:
            return f"the wire carried {cap['uplink_kind']} updates: the server has their sum only"
        if self.options.parameters == "all" and cap.get("updates") is None:
            return f"whole uplinks were not recorded (set attacks.{self.name}.parameters: all before training)"
        if len(cap["individual"]) < self.options.min_clients:
            return f"{len(cap['individual'])} uplinks in the captured round, fewer than min_clients={self.options.min_clients}"
        return None

    def prepare(self, ctx):
        cohort = ctx.tap.capture["cohort"]
        return {"parameters": self.options.parameters}, {"sizes": {cid: ctx.fed.clients[cid].num_examples for cid in cohort}}

    def run(self, view, aux):
        cap = view.capture  # the server's view: each client's update as sent
        if aux["parameters"] == "all":
            return {cid: math.sqrt(sum(float(t.double().pow(2).sum()) for t in u.values())) for cid, u in cap.updates.items()}
        return {cid: float(delta.double().norm()) for cid, delta in cap.individual.items()}

    def score(self, guess, truth):
        clients = sorted(guess)
        rho = spearman([guess[c] for c in clients], [truth["sizes"][c] for c in clients])
        return AttackResult(
            attack=self.name, role=self.role.value, metrics={"spearman": rho}, chance={"spearman": 0.0},
            details={"clients": len(clients), "parameters": self.options.parameters},
        )  # fmt: skip
