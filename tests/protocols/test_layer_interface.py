"""The protocol-layer interface stays narrow (issue 44): a handful of hooks grouped by phase, each layer built from
its own typed settings and the run's public facts, never the whole config; a third-party layer (a clip of the
client updates, with its own config section) needs no change to ``secure_fed/`` or ``protocols/``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import torch
from pydantic import BaseModel, Field

from secure_fed.config import build_plan, schema
from secure_fed.engine import Experiment
from secure_fed.engine.layers import ClientSide, LayerState, Ledger, ProtocolLayer, ProtocolStack, SetupResult
from secure_fed.plugin_specs import LayerSpec, layer_specs
from tests.conftest import register_plugins, small_config

ROOT = Path(__file__).resolve().parents[2]
MAX_HOOKS = 8


def hooks() -> set[str]:
    """The methods a layer may override: the public callables of :class:`ProtocolLayer`."""
    return {n for n, v in vars(ProtocolLayer).items() if not n.startswith("_") and callable(v)}


def test_the_layer_interface_has_few_hooks_and_the_stack_calls_no_other():
    assert hooks() == {"setup", "wrap_algorithm", "clients", "open_round", "ledger", "state"}
    assert len(hooks()) <= MAX_HOOKS
    # what the stack calls on a layer object: a hook, or its name (nothing behind the hooks' backs)
    called = set()
    for node in ast.walk(ast.parse(inspect.getsource(ProtocolStack))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "layer":
            called.add(node.attr)
    assert called - {"name"} <= hooks(), called


CONFIGS = [  # between them every built-in layer
    ["algorithm.name=fedalc", "algorithm.normalize_gamma=false", 'protocols=["keyed_hashing", "dp", "secure_aggregation"]',
     'privacy.instance={"noise_multiplier": 2.0, "sample_rate": 0.2}',
     'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}'],
    ["algorithm.name=fedaws", 'protocols=["dp", "ckks"]', 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}'],
]  # fmt: skip


def _reaches_config(obj, config_type, seen: set[int], depth: int = 0) -> str | None:
    """A path from ``obj`` to an instance of ``config_type`` through attributes, dataclass fields and containers."""
    if isinstance(obj, config_type):
        return "<config>"
    if depth > 4 or id(obj) in seen or callable(obj) or isinstance(obj, torch.Tensor | str | bytes | int | float):
        return None
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list | tuple | set):
        items = list(enumerate(obj))
    elif dataclasses.is_dataclass(obj) or type(obj).__module__.split(".")[0] in ("protocols", "secure_fed"):
        items = list(getattr(obj, "__dict__", {}).items())
    else:
        return None
    for key, value in items:
        if (path := _reaches_config(value, config_type, seen, depth + 1)) is not None:
            return f".{key}{path}"
    return None


@pytest.mark.parametrize("overrides", CONFIGS, ids=["keyed_hashing+dp+secagg", "dp+ckks"])
def test_each_layer_is_built_from_its_own_settings_never_the_config(tmp_path, overrides):
    cfg = small_config(*overrides)
    plan = build_plan(cfg)
    exp = Experiment(plan, run_dir=tmp_path)
    specs = layer_specs()
    assert [layer.name for layer in exp.stack.layers] == list(plan.protocols)
    for layer in exp.stack.layers:
        spec = specs[layer.name]
        assert spec.settings is not None, f"{layer.name}: its spec gives no settings builder"
        assert type(layer.settings) is type(spec.settings(plan)) and not isinstance(layer.settings, type(cfg) | type(plan))
        for whole in (type(cfg), type(plan)):  # neither the run's config nor its whole plan
            where = _reaches_config(layer, whole, set())
            assert where is None, f"{layer.name} holds the run's whole {whole.__name__} at layer{where}"
        # the hooks' products are the interface's types
        assert isinstance(layer.clients(), ClientSide) and isinstance(layer.ledger(), Ledger)
        assert isinstance(layer.state(), LayerState)


#: the settings builders: the only code under protocols/ that reads the run's config sections
SETTINGS_BUILDERS = {"protocols/layer_specs.py", "protocols/layer_settings.py", "protocols/config_sections.py"}


def config_reads() -> list[str]:
    """Reads of a whole-config section or plan part (``cfg.training``, ``plan.training``, ``self.cfg.privacy``, …) or
    a plan's plugin section (``plan.part(...)``) in protocols/ outside the builders."""
    sections = set(schema.experiment_config_model().model_fields)
    found = []
    for path in sorted((ROOT / "protocols").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in SETTINGS_BUILDERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr in sections):
                continue
            base = node.value
            whole = ("cfg", "plan")
            if (isinstance(base, ast.Name) and base.id in whole) or (isinstance(base, ast.Attribute) and base.attr in whole):
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "part":
                found.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_layer_module_reads_the_runs_config_outside_the_settings_builders():
    assert config_reads() == []


# ---------------------------------------------------------------------------------------------- a third-party layer
class ClippingSection(BaseModel):
    """A plugin's own config section (``clipping:``), registered as ``secure_fed.config_sections`` would."""

    max_norm: float = Field(1.0, gt=0.0)


class ClippingLayer(ProtocolLayer):
    """Clips each client's θ update to ``clipping.max_norm`` on the client (its only hook: ``clients``)."""

    name = "clipping"
    norms: list[float] = []

    def clients(self) -> ClientSide:
        max_norm = self.settings.max_norm

        def mod(fn):
            def clipped(payload, data):
                reply = fn(payload, data)
                delta = reply["theta_delta"]
                norm = float(torch.sqrt(sum((t.double() ** 2).sum() for t in delta.values())))
                scale = min(1.0, max_norm / max(norm, 1e-12))
                ClippingLayer.norms.append(norm * scale)
                return {**reply, "theta_delta": {k: t * scale for k, t in delta.items()}}

            return clipped

        return ClientSide(mod=mod)


CLIPPING = LayerSpec(name="clipping", threat_model="bounds each client's θ update; protects nothing by itself",
                     implementation=f"{__name__}:ClippingLayer", settings=lambda plan: plan.part(ClippingSection))  # fmt: skip


@pytest.fixture
def clipping_registered(monkeypatch):
    register_plugins(monkeypatch, {"layers": {"clipping": CLIPPING}, "config_sections": {"clipping": ClippingSection}})
    ClippingLayer.norms = []
    yield
    schema.experiment_config_model.cache_clear()


def test_a_third_party_clipping_layer_with_its_own_section_runs(tmp_path, clipping_registered):
    cfg = small_config("algorithm.name=fedavg", 'protocols=["clipping"]', "clipping.max_norm=0.01", "training.rounds=2")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path)
    (layer,) = exp.stack.layers
    assert isinstance(layer.settings, ClippingSection) and layer.settings.max_norm == 0.01
    assert ProtocolLayer.setup(layer, None) == SetupResult()  # the defaults: no setup, no ledger, no state
    exp.run(progress=False)
    assert len(ClippingLayer.norms) == 2 * len(exp.fed.clients)
    assert max(ClippingLayer.norms) <= 0.01 * (1 + 1e-9)


def test_every_layer_takes_its_secret_randomness_from_protocols_randomness():
    """One home for the streams a guarantee relies on: every import of SecretStream names protocols.randomness."""
    wrong = []
    for path in sorted((ROOT / "protocols").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "SecretStream" for a in node.names):
                if node.module != "protocols.randomness":
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}")
    assert wrong == []
