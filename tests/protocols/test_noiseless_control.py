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
    with pytest.raises(ConfigError, match="privacy.client.noise_multiplier 0 .* the client unit's ε ∞"):
        small_config("protocols=[dp]", "privacy.client={noise_multiplier: 0, target_epsilon: 3}")
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
    """σ = 0 trains what σ = 1 trains with the discrete Gaussian draw replaced by zeros, up to the grid rounding a
    noisy release snaps to (the same clip, bound and split; an independent way to switch the noise off), differs
    from the run without the dp layer (the clip at C = 0.05 acts), and reports ε = ∞ for the unit and the released
    model, with the console's noiseless line."""
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


def test_the_base_accountant_reports_infinity_whatever_a_registered_accountant_computes(monkeypatch):
    """A third party's accountant whose own computation would give a finite number for a σ = 0 step still reports ∞:
    the interface answers before it."""
    from protocols.dp import accountants
    from protocols.dp.accountants.base import Accountant

    class Optimist(Accountant):
        name, title = "optimist", "optimist"

        def _epsilon(self, entries, delta):
            return 0.5

    monkeypatch.setitem(accountants.ACCOUNTANTS, "optimist", Optimist)
    assert make_accountant("optimist", [(1.0, 0.5, 3)]).get_epsilon(1e-5) == 0.5
    assert make_accountant("optimist", [(1.0, 0.5, 3), (0.0, 0.5, 1)]).get_epsilon(1e-5) == math.inf


def test_a_target_anywhere_in_the_instance_unit_beside_a_noiseless_block_is_refused():
    with pytest.raises(ConfigError, match=r"privacy.instance.noise_multiplier 0 .* privacy.local.target_epsilon"):
        small_config("algorithm.name=fedalc", "algorithm.normalize_gamma=false", "protocols=[dp]",
                     "privacy.instance={noise_multiplier: 0}",
                     "privacy.local={noise_multiplier: 1, target_epsilon: 40, batch_sample_rate: 1.0, "
                     "max_labels_per_instance: 2}")  # fmt: skip


def test_the_graph_says_why_and_a_noiseless_client_unit_reports_before_any_step(tmp_path):
    """The observer's ∞ names the noiseless mechanism; a summary taken before round 1 (an interrupt) is 0, not an
    error from the group bound; GDP (report_gdp) answers ∞, not a division by zero."""
    from tests.conftest import small_plan

    plan = small_plan("algorithm.name=fedaws", "protocols=[dp]", "privacy.report_gdp=true",
                      "privacy.client={noise_multiplier: 0, max_labels_per_instance: 2}")  # fmt: skip
    exp = Experiment(plan, run_dir=tmp_path / "r")
    before = exp.privacy_summary()["units"]["client"]
    assert before["epsilon"] == 0.0 and before["instance_level"]["epsilon"] == 0.0
    exp.run(progress=False)
    u = exp.privacy_summary()["units"]["client"]
    assert u["adversaries"]["observer"]["epsilon"] == "inf"
    assert "noiseless control" in u["adversaries"]["observer"]["why"], u["adversaries"]["observer"]
    assert u["approximate"]["gdp"]["epsilon"] == "inf" and "epsilon_bound" not in u


def test_a_step_with_no_mechanism_is_named_before_the_noiseless_control(tmp_path):
    """FedALC's W step over label sets is released in the clear when only the client unit is set: the console names
    it (the un-noised step), not the noiseless control, which would hide it."""
    from secure_fed.privacy_lines import privacy_lines
    from tests.conftest import small_plan

    exp = Experiment(small_plan("protocols=[dp]", "privacy.client={noise_multiplier: 0, max_labels_per_instance: 2}"),
                     run_dir=tmp_path / "r")  # fmt: skip
    exp.run(progress=False)
    line = privacy_lines(exp.privacy_summary())
    assert "W's label-set step" in line[0] and "noiseless control" not in line[0], line
