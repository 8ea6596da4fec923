"""The console's privacy lines at the end of a run, and ``validate``'s line for the released model's ε.

A run whose released θ or W is shaped by a step without DP noise (e.g. FedALC with only the W step's
``privacy.instance``) has ε = ∞ for the released model: the console says so in one short sentence, naming the
un-noised step and each unit's ε for what it covers, and points to ``validate``, which prints the why in full. The
rule is one function (:func:`protocols.dp.released_model.unnoised_steps`) shared by the layer's privacy report and
``validate``'s plan; the tests check both against it."""

from __future__ import annotations

import types

import pytest

from protocols.layer_specs import unnoised_steps_of_plan
from secure_fed.privacy_lines import privacy_lines
from tests.config.test_bad_input import cli
from tests.conftest import SMALL

#: the console's ∞ sentence may not grow back into a paragraph (with a config path of a usual length)
MAX_INFINITY_LINE = 200

W_STEP_ONLY = ["protocols=[dp]", "algorithm.name=fedalc", "algorithm.normalize_gamma=false",
               'privacy.instance={"target_epsilon": 2.0, "sample_rate": 0.1}']  # fmt: skip
COVERED = [*W_STEP_ONLY, 'privacy.local={"target_epsilon": 2.0, "batch_sample_rate": 0.5, "max_labels_per_instance": 4}']


def _layer_units(overrides):
    from protocols.dp.layer import DifferentialPrivacy
    from secure_fed.config import load_plan
    from secure_fed.plugin_specs import layer_specs

    plan = load_plan(overrides=overrides)
    env = types.SimpleNamespace(num_clients=20, max_clients_per_instance=4, theta={}, update_layout=lambda: None, has_rows=True)
    return plan, DifferentialPrivacy(layer_specs()["dp"].settings(plan), env).privacy()


@pytest.mark.parametrize("overrides", [W_STEP_ONLY, COVERED, ["protocols=[dp]", 'privacy.client={"noise_multiplier": 1.0}']])
def test_validate_and_the_layer_name_the_same_unnoised_steps(overrides):
    """The layer's report (every unit's ``unnoised`` list, the observer's ε) and ``validate``'s plan agree."""
    from secure_fed.plugin_specs import layer_specs

    plan, report = _layer_units(overrides)
    expected = unnoised_steps_of_plan(plan)
    for unit in report.values():
        assert unit["unnoised"] == expected
        assert (unit["adversaries"]["observer"]["epsilon"] == "inf") == bool(expected)
    line = layer_specs()["dp"].describe(plan, 20)[-1]
    assert line.startswith("dp released model (the observer: sees θ, W and the files): ")
    if expected:
        assert "ε = ∞: no ε bounds the released" in line and all(x["why"] in line for x in expected)
    else:
        assert "covered: every step that shapes θ and W has a DP mechanism" in line and "∞" not in line


def test_w_step_only_is_infinite_and_the_covered_recipe_is_not():
    assert [x["step"] for x in unnoised_steps_of_plan(_layer_units(W_STEP_ONLY)[0])] == ["client_training"]
    assert unnoised_steps_of_plan(_layer_units(COVERED)[0]) == []


def test_the_infinity_line_is_one_short_sentence():
    why = unnoised_steps_of_plan(_layer_units(W_STEP_ONLY)[0])
    record = {"epsilon": "inf", "delta": 1e-5, "unit": "instance", "why": "long " * 100,
              "units": {"instance": {"epsilon": 1.8461, "delta": 1e-5, "unnoised": why, "adversaries": {}}}}  # fmt: skip
    lines = privacy_lines(record, "runs/x/config.yaml")
    assert len(lines) == 1
    line = lines[0]
    assert len(line) <= MAX_INFINITY_LINE, len(line)
    assert line == ("  privacy: ε = ∞ for the released θ and W: client training has no DP noise (instance unit ε = 1.846 "
                    "covers only part); details: secure-fed validate runs/x/config.yaml")  # fmt: skip


def test_a_w_step_only_run_ends_with_the_short_line_and_validate_has_the_details(tmp_path):
    sets = [x for s in [*SMALL, "training.rounds=2", *W_STEP_ONLY] for x in ("--set", s)]
    code, out, err = cli("run", *sets, "--out", str(tmp_path / "run"))
    assert code == 0, err
    last = out.strip().splitlines()[-1]
    assert last.startswith("  privacy: ε = ∞ for the released θ and W: client training has no DP noise (instance unit ε = ")
    assert last.endswith(f"details: secure-fed validate {tmp_path / 'run' / 'config.yaml'}")
    assert len(last.replace(str(tmp_path), "runs")) <= MAX_INFINITY_LINE and "privacy per" not in out  # a path of a usual length
    code, out, err = cli("validate", str(tmp_path / "run" / "config.yaml"))
    assert code == 0, err
    assert "dp released model (the observer: sees θ, W and the files): ε = ∞: no ε bounds the released θ and W: " in out
    assert "client training is un-noised" in out and "privacy.local or privacy.client covers it" in out
