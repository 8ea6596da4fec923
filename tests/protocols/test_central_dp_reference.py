"""The oracle under ``dp``: DP-SGD on its one trainer (``privacy.local``) is central DP-SGD, the reference a trade-off
study draws beside the federated methods (the price of federation apart from the price of privacy)."""

from __future__ import annotations

import pytest
import torch

from secure_fed.algorithms.losses import softmax_multilabel_loss
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_config, small_plan

CENTRAL = ["algorithm.name=oracle", "algorithm.validation_fraction=0", "protocols=[dp]", "model.fixed_encoder=true",
           'privacy.local={"clip_norm": 1.0, "noise_multiplier": 2.0, "batch_sample_rate": 1.0}']  # fmt: skip


def test_the_oracle_trains_under_central_dp_sgd_and_reports_its_epsilon(tmp_path):
    res = Experiment(small_plan(*CENTRAL, "training.rounds=2"), run_dir=tmp_path).run(progress=False)
    unit = res.privacy["units"]["instance"]
    assert 0 < res.privacy["epsilon"] < 10 and unit["steps"] == 2  # one instance on one trainer: one step a round
    assert "up to 1 clients' training" in unit["scope"]
    noisy = Experiment(small_plan(*CENTRAL, "training.rounds=2", "privacy.noise_seed=1"), run_dir=tmp_path / "a")
    other = Experiment(small_plan(*CENTRAL, "training.rounds=2", "privacy.noise_seed=2"), run_dir=tmp_path / "b")
    noisy.run(progress=False)
    other.run(progress=False)
    assert not torch.equal(noisy.W, other.W)  # the noise is drawn (two secrets, two models)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["algorithm.validation_fraction=0.1"], "validation_fraction 0.1 selects the reported epoch"),
        (['privacy.client={"noise_multiplier": 1.0}'], "privacy.local only"),
        (["protocols=[dp, secure_aggregation]"], "no protocol layer applies but dp"),
    ],
)
def test_what_the_central_reference_cannot_be_is_one_error(extra, needle):
    with pytest.raises(ConfigError, match=needle):
        small_config(*CENTRAL, *extra)


def test_one_instances_softmax_loss_is_the_batch_formula_and_runs_under_vmap():
    """DP-SGD takes per-sample losses under vmap (no boolean indexing): one row's loss equals the batch formula's."""
    torch.manual_seed(0)
    s, y = torch.randn(5, 7), torch.rand(5, 7) > 0.6
    y[0] = True
    for i in range(5):
        want = softmax_multilabel_loss(torch.cat([s[i : i + 1], s[i : i + 1]]), torch.cat([y[i : i + 1], y[i : i + 1]]))
        assert torch.allclose(softmax_multilabel_loss(s[i : i + 1], y[i : i + 1]), want)
    per = torch.vmap(lambda a, b: softmax_multilabel_loss(a.unsqueeze(0), b.unsqueeze(0)))(s, y)
    assert per.shape == (5,)
