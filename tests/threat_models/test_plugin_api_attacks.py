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
    from secure_fed.plugin_api.attacks import build_experiment

    plan = load_plan(overrides=["training.rounds=2", "seed=5", "protocols=[keyed_hashing]"])
    exp = build_experiment(plan, run_dir=tmp_path / "run")
    # the run holds the plan with its data- and machine-dependent choices resolved: the same config, the same settings
    assert exp.plan.config_yaml == plan.config_yaml and (exp.plan.seed, exp.plan.protocols) == (5, ("keyed_hashing",))
    assert exp.plan.training.rounds == plan.training.rounds and exp.plan.device in ("cpu", "cuda")


def test_the_attacks_memory_terms_read_the_plan():
    """``attacks:``'s memory phases call each listed attack's ``memory(shape, plan)`` with the plan: embedding
    identification's term follows the plan's evaluation.max_test and model.embedding_dim."""
    from secure_fed.plugin_api.attacks import DataShape
    from threat_models.attacks_section import attacks_of

    shape = DataShape(train=500, test=300, features=20, labels=7, train_values=0, test_values=0, label_entries=0, dense=False)
    for max_test, dim in ((None, 16), (100, 32)):
        ov = ["attacks.run=[embedding_identification, token_linkage]", f"model.embedding_dim={dim}"]
        plan = load_plan(overrides=[*ov, f"evaluation.max_test={'null' if max_test is None else max_test}"])
        rows = 300 if max_test is None else max_test
        assert attacks_of(plan).memory_phases(plan, shape) == {"attack embedding_identification": rows * 7 + 2 * 4 * 7 * dim}


def test_membership_inferences_shadow_recipe_ignores_the_attacks_settings(tmp_path):
    """The shadows' recipe (and so their cache folder) is the target's run without its attacks: an audit that changes
    attacks.* settings (``audit --set``) reuses the shadows an earlier audit trained; a change of the run does not."""
    from types import SimpleNamespace

    import scipy.sparse as sp

    from threat_models.attacks.membership_inference import _ShadowTrainer
    from threat_models.attacks_section import attacks_of

    def recipe(*ov):
        plan = load_plan(overrides=["attacks.run=[membership_inference]", *ov])
        ds = SimpleNamespace(label_names=["a", "b"], feature_kind="sparse", name="toy", image_shape=None)
        ctx = SimpleNamespace(plan=plan, dataset=ds, exp=SimpleNamespace(run_dir=tmp_path))
        return _ShadowTrainer(ctx, sp.csr_matrix((4, 3)), sp.csr_matrix((4, 2)), attacks_of(plan).membership_inference)

    base = recipe()
    assert recipe("attacks.membership_inference.shadows=9", "attacks.run=[all]").dir == base.dir
    assert recipe("training.rounds=7").dir != base.dir
    assert attacks_of(base.plan).names() == [] and base.plan.output.progress is False
    assert base.plan.evaluation.every == base.plan.training.rounds and base.plan.evaluation.max_test == 16


def test_the_noise_free_replay_is_the_run_without_attacks_and_noise():
    from protocols.config_sections import PrivacyConfig
    from threat_models.attacks.one_run_audit import replay_plan
    from threat_models.attacks_section import attacks_of

    client = '{"clip_norm": 0.5, "target_epsilon": 2}'
    ov = ["algorithm.name=fedavg", "partition.name=iid", "protocols=[dp]", f"privacy.client={client}",
          "attacks.run=[one_run_audit]", "seed=3"]  # fmt: skip
    plan = load_plan(overrides=ov)
    replay = replay_plan(plan)
    p = replay.part(PrivacyConfig)
    assert (p.client.noise_multiplier, p.client.target_epsilon, p.client.clip_norm) == (1e-9, None, 0.5)
    assert p.local is None and p.instance is None and attacks_of(replay).names() == []
    assert (replay.seed, replay.protocols, replay.training) == (plan.seed, plan.protocols, plan.training)
