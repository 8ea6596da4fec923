"""The plan builder (``secure_fed/config/plan_builder.py``): every core key of the config reaches the plan, and the
stack is validated on the plan while the config validates."""

from __future__ import annotations

import dataclasses

import pytest

from secure_fed.config import build_plan, load_config, load_plan
from secure_fed.config.plan_builder import _CORE, _CORE_KEYS
from secure_fed.config.schema import CoreConfig
from secure_fed.errors import ConfigError
from secure_fed.plan import RunPlan


def test_the_plan_holds_every_core_key_of_the_config_and_only_plugin_sections_besides():
    assert {*_CORE, *_CORE_KEYS} == set(CoreConfig.model_fields)
    plan = load_plan(None, ["protocols=[dp]", "privacy.client={target_epsilon: 4, clip_norm: 1}"])
    assert not set(plan.sections) & set(CoreConfig.model_fields)
    assert {f.name for f in dataclasses.fields(RunPlan)} == {*_CORE, *_CORE_KEYS, "config_yaml", "sections"}
    assert plan.protocols == ("dp",) and plan.seed == 0 and plan.backend == "inprocess"


def test_the_layers_rules_run_on_the_plan_while_the_config_validates(monkeypatch):
    """``CoreConfig``'s cross-check calls ``validate_stack`` with the config's plan: a layer's ``validate`` sees a
    :class:`RunPlan` (never the config object), and its refusal is the config's one-line error."""
    import secure_fed.plugin_specs as specs

    seen = []
    real = specs.validate_stack

    def spy(plan):
        seen.append(type(plan))
        if plan.training.rounds == 3:
            raise ValueError("three rounds refused by the spy")
        return real(plan)

    monkeypatch.setattr("secure_fed.config.schema.validate_stack", spy)
    assert isinstance(build_plan(load_config(None, ["training.rounds=2"])), RunPlan)
    assert seen and set(seen) == {RunPlan}
    with pytest.raises(ConfigError, match="three rounds refused by the spy"):
        load_config(None, ["training.rounds=3"])


def test_a_plan_is_planned_again_with_overrides_never_changed():
    plan = load_plan(None, ["training.rounds=2"])
    assert load_plan(plan) is plan
    again = load_plan(plan, ["training.rounds=5"])
    assert (again.training.rounds, plan.training.rounds) == (5, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.training.rounds = 9  # type: ignore[misc]


def test_a_plan_is_frozen_all_the_way_down_and_pickles():
    """Assigning to a core part, a plugin section or a section nested in one is refused, lists are tuples, and a
    plan survives pickling (a process pool's workers receive plans) with its sections still frozen."""
    import pickle

    from protocols.config_sections import PrivacyConfig

    plan = load_plan(overrides=["protocols=[dp]", "privacy.client={target_epsilon: 4, clip_norm: 1}"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.training.rounds = 3  # type: ignore[misc]
    with pytest.raises(ValueError, match="frozen"):
        plan.part(PrivacyConfig).noise_seed = 3
    with pytest.raises(ValueError, match="frozen"):
        plan.part(PrivacyConfig).client.clip_norm = 2.0
    assert isinstance(plan.evaluation.ks, tuple)
    again = pickle.loads(pickle.dumps(plan))
    assert again == plan and again.part(PrivacyConfig).client.clip_norm == 1.0
    with pytest.raises(ValueError, match="frozen"):
        again.part(PrivacyConfig).noise_seed = 3


def test_sparse_updates_auto_is_resolved_by_the_stack_the_config_lists():
    """``training.sparse_updates: auto`` is true where every listed layer takes row-sparse θ updates, false where one
    takes only dense ones (client-level DP clips and noises whole updates); an explicit value stays."""
    from secure_fed.plugin_specs import dense_update_layers

    plain = load_plan(None, [])
    dp = load_plan(None, ["protocols=[dp]", "privacy.client={target_epsilon: 4, clip_norm: 1}"])
    assert (plain.training.sparse_updates, dp.training.sparse_updates) == (True, False)
    assert (dense_update_layers(plain), dense_update_layers(dp)) == ([], ["dp"])  # the rule it follows, independently
    assert load_plan(None, ["training.sparse_updates=false"]).training.sparse_updates is False
    import yaml

    assert yaml.safe_load(plain.config_yaml)["training"]["sparse_updates"] == "auto"  # as written: a resume compares it
