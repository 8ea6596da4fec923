"""Membership inference runs on every model family (embedding, linear_head, ctran): the five scores (LOSS, LiRA
online/offline, RMIA online/offline) from the same shadow runs, each an AUC in [0, 1] with its CI around it."""

from __future__ import annotations

import pytest
import torch

from secure_fed.engine import Experiment
from tests.conftest import small_config
from threat_models.audit import audit
from threat_models.context import AuditContext

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
    cfg = small_config("attacks.run=[membership_inference]", f"{MI}.shadows=2", f"{MI}.bootstrap=20", *FAMILIES[family])
    assert cfg.model.family == family
    e = Experiment(cfg, run_dir=tmp_path / "run")
    e.run(progress=False)
    res = audit(AuditContext(e), progress=False)["attacks"]["membership_inference"]
    assert set(res["metrics"]) == {"loss", "lira_online", "lira_offline", "rmia_online", "rmia_offline"}
    for name, m in res["metrics"].items():
        lo, hi = m["auc_ci95"]
        assert 0.0 <= lo <= m["auc"] <= hi <= 1.0, (name, m)
    assert res["details"]["shadows"] == 2
