"""The audit's verdict lines (planted intervals, so each rule can fail), its cost headline, and the attacks' specs
against what they report."""

from __future__ import annotations

import json

import pytest

from threat_models.audit_cost import OVERHEAD_S, SHADOW_ROUND_FACTOR, estimate
from threat_models.verdict import bonferroni_interval, verdict_lines


def _mia(**aucs):
    """A membership-inference record with the planted (AUC, 95% interval) of each score."""
    return {"membership_inference": {"metrics": {k: {"auc": a, "auc_ci95": list(ci), "tpr_at_1pct_fpr": 0.2}
                                                 for k, (a, ci) in aucs.items()}}}  # fmt: skip


def test_an_auc_interval_above_one_half_is_a_leak_named_with_its_score_and_interval():
    (line,) = verdict_lines(_mia(loss=(0.51, (0.49, 0.53)), lira_online=(0.70, (0.66, 0.74))))
    assert line.startswith("membership_inference: leak: LiRA online AUC 0.700 [")
    assert "TPR at 1% FPR 0.200" in line and "Bonferroni over the audit's 2 AUCs, each at 97.50%" in line


def test_intervals_that_contain_one_half_are_no_measurable_leakage():
    (line,) = verdict_lines(_mia(loss=(0.50, (0.48, 0.52)), rmia_online=(0.52, (0.49, 0.55))))
    assert line.startswith("membership_inference: no leakage measurable at this power: every AUC interval contains 0.5")
    assert "the highest, RMIA online AUC 0.520" in line


def test_bonferroni_turns_a_marginal_score_among_five_into_no_leak():
    """0.53 [0.505, 0.555] excludes 0.5 at 95% alone; among five scores its 99% interval (×2.576/1.960) does not."""
    marginal = (0.53, (0.505, 0.555))
    assert verdict_lines(_mia(loss=marginal))[0].startswith("membership_inference: leak:")
    five = _mia(
        loss=marginal, **{k: (0.50, (0.48, 0.52)) for k in ("lira_online", "lira_offline", "rmia_online", "rmia_offline")}
    )
    assert verdict_lines(five)[0].startswith("membership_inference: no leakage measurable")
    lo, hi = bonferroni_interval(0.53, [0.505, 0.555], 5)
    assert lo == pytest.approx(0.53 - 0.025 * 2.5758 / 1.95996, abs=1e-4) and hi == pytest.approx(0.53 + 0.025 * 1.3142, abs=1e-4)
    assert bonferroni_interval(0.53, [0.505, 0.555], 1) == pytest.approx((0.505, 0.555))


def test_the_one_run_audit_is_judged_on_its_lower_bound_and_others_get_no_verdict():
    attacks = {
        "one_run_audit": {"metrics": {"epsilon_lower_bound": 0.8}, "details": {"confidence": 0.95}},
        "token_linkage": {"metrics": {"linked": 1.0}},
        "update_inversion": {"skipped": "no uplinks"},
    }
    lines = verdict_lines(attacks)
    assert lines[0].startswith("one_run_audit: leak: ε ≥ 0.800") and "at 95% confidence" in lines[0]
    assert lines[1].startswith("token_linkage: no verdict") and len(lines) == 2  # a skipped attack has no line
    attacks["one_run_audit"]["metrics"]["epsilon_lower_bound"] = 0.0
    assert verdict_lines(attacks)[0].startswith("one_run_audit: no leakage measurable at this power")


def test_the_cost_headline_counts_shadow_rounds_and_uses_the_runs_pace(tmp_path):
    from secure_fed.config import load_plan

    (tmp_path / "private").mkdir()
    (tmp_path / "private" / "summary.json").write_text(json.dumps({"seconds_per_round": 0.5}))
    plan = load_plan(overrides=["training.rounds=10", "attacks.membership_inference.shadows=4"])
    line, seconds = estimate(tmp_path, plan, ["membership_inference"])
    assert "trains 4 shadow runs × 10 rounds = 40 shadow rounds" in line
    assert seconds == pytest.approx(40 * 0.5 * SHADOW_ROUND_FACTOR + OVERHEAD_S)
    cache = tmp_path / "shadows" / "abc"
    cache.mkdir(parents=True)
    (cache / "shadow0.npz").write_bytes(b"")
    line, fewer = estimate(tmp_path, plan, ["membership_inference"])
    assert "trains 3 shadow runs" in line and "1 cached" in line and fewer < seconds
    (tmp_path / "private" / "summary.json").unlink()
    assert estimate(tmp_path, plan, ["membership_inference"])[1] is None


def test_each_attacks_description_names_the_scores_its_spec_declares():
    from secure_fed.plugin_specs import attack_specs

    for name, spec in attack_specs().items():
        assert spec.scores, name
        for key, word in spec.scores.items():
            assert word in spec.description, (name, key, word)
    mia = attack_specs()["membership_inference"]
    assert {"LOSS", "LiRA", "RMIA"} <= set(mia.scores.values())
    assert "only W" not in mia.defended_by and "privacy.local" in mia.defended_by
