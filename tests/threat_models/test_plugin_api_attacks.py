"""The attacks' public plugin API (``secure_fed.plugin_api.attacks``): light to import, every name it lists resolves,
and its helpers make and build variants of a run plan."""

from __future__ import annotations

import subprocess
import sys

import pytest

from secure_fed.config import load_plan
from secure_fed.errors import ConfigError


def test_importing_the_api_and_an_attacks_spec_loads_no_torch():
    code = (
        "import sys; import secure_fed.plugin_api.attacks as a; a.AttackSpec; a.RunPlan; a.attack_specs; "
        "import threat_models.attacks.membership_inference_spec; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_listed_name_resolves():
    import secure_fed.plugin_api.attacks as api

    missing = [n for n in api.__all__ if getattr(api, n, None) is None]
    assert not missing
    with pytest.raises(AttributeError):
        api.not_a_name  # noqa: B018


def test_a_plan_variant_applies_its_overrides_and_leaves_the_plan_alone():
    from secure_fed.plugin_api.attacks import plan_variant
    from threat_models.attacks_section import attacks_of

    plan = load_plan(overrides=["training.rounds=3", "attacks.run=[token_linkage]", "attacks.one_run_audit.canaries=7"])
    variant = plan_variant(plan, ["seed=11", "attacks={run: []}"])
    assert (variant.seed, variant.training.rounds, attacks_of(variant).names()) == (11, 3, [])
    assert attacks_of(variant).one_run_audit.canaries == 1000  # the whole section reset to its defaults
    assert (plan.seed, attacks_of(plan).names(), attacks_of(plan).one_run_audit.canaries) == (0, ["token_linkage"], 7)
    with pytest.raises(ConfigError, match="training.rounds"):
        plan_variant(plan, ["training.rounds=0"])


def test_a_run_built_from_a_plan_is_that_plans_run(tmp_path):
    from secure_fed.plugin_api.attacks import build_experiment, plan_of

    plan = load_plan(overrides=["training.rounds=2", "seed=5", "protocols=[keyed_hashing]"])
    exp = build_experiment(plan, run_dir=tmp_path / "run")
    assert plan_of(exp).config_yaml == plan.config_yaml
    assert (plan_of(exp).seed, plan_of(exp).protocols) == (5, ("keyed_hashing",))
