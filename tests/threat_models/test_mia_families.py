"""Membership inference runs on every model family (embedding, linear_head, ctran): the five scores (LOSS, LiRA
online/offline, RMIA online/offline) from the same shadow runs, each an AUC in [0, 1] with its CI around it."""

from __future__ import annotations

import pytest
import torch

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL
from threat_models.audit import audit
from threat_models.context import AuditContext


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


MI = "attacks.membership_inference"
FAMILIES = {
    "embedding": [],
    "linear_head": ["model.family=linear_head", "algorithm.name=fedavg", "partition.name=iid", "algorithm.loss=bce"],
    "ctran": ["algorithm.name=fedlgt", "model.family=ctran", "model.embedding_dim=16",
              "model.ctran={layers: 1, heads: 2, token_size: 4}", "partition.name=iid"],
}  # fmt: skip


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_score_on_every_model_family(tmp_path, family):
    torch.set_num_threads(1)
    plan = small_plan("attacks.run=[membership_inference]", f"{MI}.shadows=2", f"{MI}.bootstrap=20", *FAMILIES[family])
    assert plan.model.family == family
    e = build_experiment(plan, run_dir=tmp_path / "run")
    e.run(progress=False)
    res = audit(AuditContext(e), progress=False)["attacks"]["membership_inference"]
    assert set(res["metrics"]) == {"loss", "lira_online", "lira_offline", "rmia_online", "rmia_offline"}
    for name, m in res["metrics"].items():
        lo, hi = m["auc_ci95"]
        assert 0.0 <= lo <= m["auc"] <= hi <= 1.0, (name, m)
    assert res["details"]["shadows"] == 2


def test_tpr_intervals_cover_the_known_rate_of_a_planted_score():
    """Members' scores N(2, 1), non-members' N(0, 1): TPR at FPR α is Φ(2 − Φ⁻¹(1 − α)) (0.372 at 1%, 0.135 at 0.1%);
    the bootstrap intervals contain it and hold the sample's own estimate."""
    import numpy as np
    from scipy.stats import norm

    from threat_models.attacks.membership_inference import roc_summary

    rng = np.random.default_rng(0)
    n = 10_000
    member = np.r_[np.ones(n, int), np.zeros(n, int)]
    score = np.r_[rng.normal(2.0, 1.0, n), rng.normal(0.0, 1.0, n)]
    m, _ = roc_summary(member, score, bootstrap=100, seed=1)
    for key, alpha in (("tpr_at_1pct_fpr", 0.01), ("tpr_at_0.1pct_fpr", 0.001)):
        lo, hi = m[f"{key}_ci95"]
        want = norm.cdf(2.0 - norm.ppf(1.0 - alpha))
        assert lo <= m[key] <= hi and lo <= want <= hi, (key, lo, m[key], hi, want)
        assert hi - lo < 0.1
