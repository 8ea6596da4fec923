"""``membership_inference``: its spec and settings, its headline, ROC plot and shadow-run cost (light: ``secure-fed
list`` and ``validate`` import no attack).

The attack: :mod:`threat_models.attacks.membership_inference`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_api.attacks import AttackSpec

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import DataShape, RunPlan


class MembershipInferenceConfig(BaseModel):
    """``attacks.membership_inference:``"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    shadows: int = Field(
        16,
        ge=0,
        description="shadow runs on random halves of the target pool, for LiRA and RMIA (online and offline; 0: LOSS only)",
    )
    bootstrap: int = Field(200, ge=10, description="bootstrap resamples for the AUC confidence interval")
    shadow_dir: str | None = Field(None, description="where shadow runs are cached (default RUN_DIR/shadows)")
    shadow_cohort: int = Field(
        16, ge=1, description="shadow runs trained together as one vectorised cohort, clients batched (1: one after another)"
    )
    rmia_offline_a: float = Field(
        0.3, ge=0.0, le=1.0, description="offline RMIA's slope a: Pr(x) ≈ ½((1+a)·Pr_OUT(x) + (1−a)) (ML Privacy Meter's default)"
    )
    rmia_gamma: float = Field(1.0, gt=0.0, description="RMIA's pairwise threshold γ on (Pr(x|θ)/Pr(x)) / (Pr(z|θ)/Pr(z))")


#: legend names of the scores, in drawing order ("lira": results written before online LiRA)
SCORE_LABELS = {"loss": "LOSS", "lira_online": "LiRA online", "lira_offline": "LiRA offline", "lira": "LiRA offline",
                "rmia_online": "RMIA online", "rmia_offline": "RMIA offline"}  # fmt: skip


def memory_bytes(shape: DataShape, plan: RunPlan) -> float:
    """Target instances' label vectors densified (bool), at most the training split."""
    return shape.train * shape.labels


def _ci(ci) -> str:
    """`` [lo, hi]`` of a 95% interval, or nothing (a result written before intervals were reported)."""
    return "" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]"


def headline(entry) -> str:
    parts = [
        f"{SCORE_LABELS.get(k, k)} AUC {v['auc']:.3f} [{v['auc_ci95'][0]:.3f}, {v['auc_ci95'][1]:.3f}] "
        f"TPR@1%FPR {v['tpr_at_1pct_fpr']:.3f}{_ci(v.get('tpr_at_1pct_fpr_ci95'))}"
        for k, v in entry["metrics"].items()
    ]
    d = entry.get("details", {})
    if d.get("shadows"):
        on, off = d.get("fallback", {}).get("lira_online", {}), d.get("fallback", {}).get("lira_offline", {})
        parts.append(f"{d['shadows']} shadows (fallback: online {on.get('no_in_shadow', 0)} no-IN/"
                     f"{on.get('no_out_shadow', 0)} no-OUT, offline {off.get('no_out_shadow', 0)} no-OUT)")  # fmt: skip
    return "; ".join(parts)


def plot(entry, out_dir) -> list[Path]:
    """``roc.png``: the ROC curve of each score on log axes."""
    curves = entry.get("curves") or {}
    if not curves:
        return []
    from threat_models.plots import roc_plot

    order = [k for k in SCORE_LABELS if k in curves] + [k for k in curves if k not in SCORE_LABELS]
    labelled = {f"{SCORE_LABELS.get(k, k)} (AUC {entry['metrics'][k]['auc']:.3f})": curves[k] for k in order}
    shadows = (entry.get("details") or {}).get("shadows")
    title = f"membership inference ({shadows} shadows)" if shadows else "membership inference"
    return [roc_plot(labelled, Path(out_dir) / "roc.png", title=title)]


def cached_shadows(run_dir: Path, shadow_dir: str | None, shadows: int) -> int:
    """Shadows an earlier audit left in the cache (the most of any one recipe's folder there)."""
    root = Path(shadow_dir) if shadow_dir else Path(run_dir) / "shadows"
    if not root.is_dir():
        return 0
    counts = [sum((d / f"shadow{k}.npz").is_file() for k in range(shadows)) for d in root.iterdir() if d.is_dir()]
    return max(counts, default=0)


def cost(settings, plan: RunPlan, run_dir) -> tuple[str, int, str]:
    """The shadow runs still to train (those cached by an earlier audit are reused), in rounds."""
    k, rounds = settings.shadows, plan.training.rounds
    if not k:
        return f"{SPEC.name}: LOSS only (attacks.{SPEC.name}.shadows=0)", 0, ""
    cached = cached_shadows(run_dir, settings.shadow_dir, k)
    todo = (k - cached) * rounds
    reuse = f", {cached} cached from an earlier audit" if cached else ""
    runs = f"{k - cached} shadow run{'s' if k - cached != 1 else ''}"
    words = f"{SPEC.name} trains {runs} × {rounds} rounds = {todo:,} shadow rounds{reuse}"
    return words, todo, f"--set attacks.{SPEC.name}.shadows=4" if todo and k > 4 else ""


SPEC = AttackSpec(
    name="membership_inference",
    role="observer",
    needs="the released θ and W; the target instances with their labels; for LiRA and RMIA, the training recipe (public config)",
    defended_by="dp (privacy.client; or the instance unit, which covers W's label-set step and, with privacy.local, "
    "DP-SGD in client training)",
    description="LOSS threshold; with shadow runs, LiRA and RMIA (Zarifzadeh et al. 2024), each online and offline; "
    "per score AUC and TPR at 1% and 0.1% FPR with bootstrap intervals, log-scale ROC",
    scores={"loss": "LOSS", "lira_online": "LiRA", "lira_offline": "LiRA", "rmia_online": "RMIA", "rmia_offline": "RMIA"},
    implementation="threat_models.attacks.membership_inference:MembershipInference",
    memory=memory_bytes,
    settings=MembershipInferenceConfig,
    headline=headline,
    score_labels=SCORE_LABELS,
    plot=plot,
    cost=cost,
)
