"""The noiseless control, ``noise_multiplier: 0``: a DP unit that clips, bounds and samples as under DP and draws no
noise; its ε is ∞ wherever it is reported (the accountants, the privacy graph, the run's summary and console line) and
a budget beside it is refused (``secure-fed tradeoff --infinity noiseless`` runs it as a study's ε = ∞ point:
tests/threat_models/test_tradeoff.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from protocols.dp.accountants import ACCOUNTANTS, check_entry, make_accountant
from secure_fed.config import load_plan
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_config
from tests.protocols.worst_case_combinations import BASE, FAMILIES


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_every_accountant_reports_infinity_once_a_noiseless_step_is_in_the_history(name):
    acc = make_accountant(name, [(1.0, 0.1, 10)])
    finite = acc.get_epsilon(1e-5)
    assert math.isfinite(finite) and finite > 0
    acc.step(0.0, 1.0, 1)
    assert acc.get_epsilon(1e-5) == math.inf
    assert make_accountant(name, [(0.0, 1.0, 0)]).get_epsilon(1e-5) == 0.0  # no step run: nothing released
    with pytest.raises(ValueError, match="σ ≥ 0"):
        check_entry(-1e-9, 0.5, 1)


def test_a_budget_beside_no_noise_and_the_noise_that_scales_with_sigma_are_refused():
    with pytest.raises(ConfigError, match="noise_multiplier 0 .* cannot hold"):
        small_config("algorithm.name=fedaws", "protocols=[dp]",
                     "privacy.local={noise_multiplier: 0, target_epsilon: 4, batch_sample_rate: 1.0}")  # fmt: skip
    for extra in ("mechanism: tree", "adaptive_clipping: {count_noise_multiplier: 1.0}"):
        with pytest.raises(ConfigError, match="noiseless control.* needs mechanism: gaussian"):
            small_config("protocols=[dp]", f"privacy.client={{noise_multiplier: 0, {extra}}}")
    small_config("protocols=[dp]", "privacy.client={noise_multiplier: 0}")  # the plain Gaussian: accepted


def _overrides(sigma: float, clip: float = 0.05) -> list[str]:
    local = (f'privacy.local={{"noise_multiplier": {sigma}, "clip_norm": {clip}, "batch_sample_rate": 1.0, '
             '"max_labels_per_instance": 3, "copy_clip": "split"}')  # fmt: skip
    return [*BASE, *FAMILIES["fedaws"], 'protocols=["dp"]', local, "model.fixed_encoder=true", "training.local_epochs=1"]


def _released_w(plan, run_dir) -> tuple[torch.Tensor, dict]:
    exp = Experiment(plan, run_dir=run_dir)
    exp.run(progress=False)
    return exp.model.W.detach().clone(), exp.privacy_summary()


def test_the_noiseless_run_is_the_private_run_with_its_noise_draw_removed(tmp_path, monkeypatch):
    """σ = 0 trains exactly what σ = 1 trains with the discrete Gaussian draw replaced by zeros (the same clip, bound
    and split; an independent way to switch the noise off), differs from the run without the dp layer (the clip at
    C = 0.05 acts), and reports ε = ∞ for the unit and the released model, with the console's noiseless line."""
    from protocols.dp import discrete_gaussian
    from secure_fed.privacy_lines import privacy_lines

    w0, summary = _released_w(load_plan(overrides=_overrides(0.0)), tmp_path / "s0")
    assert summary["epsilon"] == "inf" and summary["units"]["instance"]["epsilon"] == "inf"
    assert summary["units"]["instance"]["adversaries"]["observer"]["epsilon"] == "inf"
    line = privacy_lines(summary)
    assert len(line) == 1 and "the noiseless control (noise_multiplier 0 for the instance unit)" in line[0], line

    with monkeypatch.context() as mp:
        mp.setattr(discrete_gaussian, "sample_discrete_gaussian", lambda stream, n, sigma, label: np.zeros(n, np.int64))
        w1, noisy = _released_w(load_plan(overrides=_overrides(1.0)), tmp_path / "s1")
    assert math.isfinite(noisy["epsilon"])  # the σ = 1 run's ledger is a real one
    torch.testing.assert_close(w0, w1, rtol=1e-6, atol=1e-7)

    plain, _ = _released_w(load_plan(overrides=[*_overrides(1.0), "protocols=[]", "privacy.local=null"]), tmp_path / "p")
    assert float((plain - w0).norm()) > 1e-2 * float(plain.norm())  # the clip shaped the noiseless run


def test_the_noiseless_plan_and_validate_say_infinity():
    from secure_fed.plugin_specs import layer_specs

    plan = load_plan(overrides=_overrides(0.0))
    line = next(x for x in layer_specs()["dp"].describe(plan, 6) if x.startswith("dp instance unit: "))
    assert "client_training: σ 0 (given)" in line and "plans ε = inf" in line, line


def test_a_noiseless_client_unit_is_infinite_per_client_and_per_instance_unless_dp_sgd_covers_the_instance(tmp_path):
    """The client unit's noiseless Gaussian: ∞ for the client and, through the group bound, per instance; beside
    noisy DP-SGD (σ = 1) the instance keeps DP-SGD's finite ε (the best protection of its channel), the ε of the same
    DP-SGD without a client unit."""
    from tests.conftest import small_plan

    def summary(*ov):
        exp = Experiment(small_plan("algorithm.name=fedaws", "protocols=[dp]", *ov), run_dir=tmp_path / str(len(ov)))
        exp.run(progress=False)
        return exp.privacy_summary()

    alone = summary("privacy.client={noise_multiplier: 0, max_labels_per_instance: 2}")
    assert alone["epsilon"] == "inf"
    assert alone["units"]["client"]["epsilon"] == "inf" and alone["units"]["client"]["instance_level"]["epsilon"] == "inf"
    local = "privacy.local={noise_multiplier: 1.0, batch_sample_rate: 1.0, max_labels_per_instance: 2}"
    both = summary("privacy.client={noise_multiplier: 0, max_labels_per_instance: 2}", local)
    dp_sgd = summary(local)
    assert both["units"]["client"]["epsilon"] == "inf"
    eps = both["units"]["instance"]["epsilon"]
    assert math.isfinite(eps) and eps == pytest.approx(dp_sgd["units"]["instance"]["epsilon"], rel=1e-9)
