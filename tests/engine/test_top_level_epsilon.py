"""The run's top-level ε is ∞ whenever a released tensor depends on a step no DP mechanism noises, with a one-line
``why``; a configuration whose every released tensor is noised reports its primary unit's ε."""

from __future__ import annotations

import json
import math

from secure_fed.engine import Experiment
from tests.conftest import small_plan

CLIENT = 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}'


def _run(tmp_path, *ov):
    exp = Experiment(small_plan('protocols=["dp"]', *ov, "training.rounds=2", "evaluation.every=1"), run_dir=tmp_path)
    return exp.run(progress=False).summary


def test_fedalc_with_client_dp_only_reports_infinite_epsilon_and_why(tmp_path):
    """fedalc's W is shaped by the server's label-set step, which privacy.client does not noise."""
    s = _run(tmp_path, "algorithm.name=fedalc", "algorithm.normalize_gamma=false", CLIENT)
    p = s["privacy"]
    assert p["epsilon"] == "inf" and "\n" not in p["why"] and "label-set step is un-noised" in p["why"]
    assert "released W" in p["why"] and "client training" not in p["why"]  # θ's client training is noised here
    client = p["units"]["client"]
    assert math.isfinite(client["epsilon"]) and client["epsilon"] > 0  # the unit keeps its ε for what it covers
    assert [x["step"] for x in client["unnoised"]] == ["label_set_collection"] and client["unnoised"][0]["released"] == ["W"]
    assert client["adversaries"]["observer"]["epsilon"] == "inf"
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines and all(x["privacy"]["epsilon"] == "inf" and x["privacy"]["why"] == p["why"] for x in lines)


def test_instance_dp_without_client_training_dp_reports_infinite_epsilon(tmp_path):
    """privacy.instance noises W's label-set step; θ's client training is left un-noised."""
    s = _run(tmp_path, "algorithm.normalize_gamma=false", 'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}')
    p = s["privacy"]
    assert p["epsilon"] == "inf" and "client training is un-noised" in p["why"] and "label-set" not in p["why"]
    assert math.isfinite(p["units"]["instance"]["epsilon"])


def test_fedaws_with_client_dp_is_covered_and_finite(tmp_path):
    """fedaws has no step over label sets (its spreadout regulariser uses no data): every released tensor is a
    function of noised client sums, so the top-level ε is the client unit's."""
    s = _run(tmp_path, "algorithm.name=fedaws", CLIENT)
    p = s["privacy"]
    unit = p["units"]["client"]
    assert "why" not in p and unit["unnoised"] == []
    assert math.isfinite(p["epsilon"]) and p["epsilon"] == unit["epsilon"] == unit["adversaries"]["observer"]["epsilon"]
