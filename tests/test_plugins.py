"""A third party adds a protocol layer without touching the core: a spec in the `secure_fed.layers` registry is
enough for `validate`, `list` and a run to find it (here the registry is extended in process, as an installed
package's entry point would extend it)."""

from __future__ import annotations

import pytest

from secure_fed.config import schema
from secure_fed.engine import Experiment
from secure_fed.engine.layers import ClientSide, Ledger, ProtocolLayer
from secure_fed.errors import ConfigError
from secure_fed.plugin_specs import LayerSpec
from tests.conftest import register_plugins, small_config, small_plan

REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


class CountingLayer(ProtocolLayer):
    """Counts the client updates that pass through it (a client mod) and the rounds (after_round)."""

    name = "counting"
    updates = rounds = 0

    def clients(self):
        def mod(fn):
            def counted(payload, data):
                CountingLayer.updates += 1
                return fn(payload, data)

            return counted

        return ClientSide(mod=mod)

    def ledger(self):
        def after_round(round_idx: int) -> None:
            CountingLayer.rounds += 1

        return Ledger(after_round=after_round)


def _refuse_fedavg_fixed(cfg, stack):
    if "counting" in stack and cfg.algorithm.name == "fedavg_fixed":
        raise ValueError("counting: refuses fedavg_fixed (to show a third-party rule)")


SPEC = LayerSpec(name="counting", threat_model="counts updates; protects nothing", implementation=f"{__name__}:CountingLayer",
                 validate=_refuse_fedavg_fixed)  # fmt: skip


@pytest.fixture
def registered(monkeypatch):
    register_plugins(monkeypatch, {"layers": {"counting": SPEC}})
    CountingLayer.updates = CountingLayer.rounds = 0
    yield
    schema.experiment_config_model.cache_clear()  # built with the test's registry


def test_a_registered_layer_is_validated_built_and_wraps_the_clients(tmp_path, registered):
    with pytest.raises(ConfigError, match="refuses fedavg_fixed"):
        small_config('protocols=["counting"]', "algorithm.name=fedavg_fixed")
    exp = Experiment(small_plan('protocols=["counting"]', "algorithm.name=fedaws", "training.rounds=3"), run_dir=tmp_path)
    exp.run(progress=False)
    assert CountingLayer.rounds == 3 and CountingLayer.updates == 3 * len(exp.fed.clients)


def test_an_unregistered_layer_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown protocol layer 'counting'"):
        small_config('protocols=["counting"]')


def test_every_light_plugin_module_imports_first_in_a_fresh_interpreter():
    """A config section's or spec's module is what ``validate`` imports first: each must import on its own, before
    the core's config package (an import circle through ``secure_fed.config`` breaks only in that order)."""
    import subprocess
    import sys
    from importlib.metadata import entry_points

    modules = sorted({ep.value.partition(":")[0] for g in ("config_sections", "layers", "attacks", "algorithms")
                      for ep in entry_points(group=f"secure_fed.{g}")})  # fmt: skip
    assert modules
    for module in modules:
        out = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, f"{module}: {out.stderr.strip().splitlines()[-1:]}"
