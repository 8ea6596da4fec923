"""The protocol layers read the run's plan, never its config (issue 54), and import secure-fed only through the public
plugin API (:mod:`secure_fed.plugin_api.layers`).

Every callable of a layer's spec is handed a :class:`~secure_fed.plan.RunPlan` and reads the layers' own sections
with ``plan.part(...)`` and the core's parts by name; the settings each layer is built with are typed precisely.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import protocols.layer_settings as layer_settings
import protocols.layer_specs as layer_specs_module
import secure_fed.plugin_api.layers as api
from protocols.config_sections import CKKSConfig, KeyedHashingConfig, PrivacyConfig, SecureAggregationConfig
from secure_fed.config import build_plan, load_plan
from secure_fed.plan import RunPlan
from secure_fed.plugin_specs import layer_specs
from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parents[2]

#: between them every built-in layer, each DP unit and mechanism, and the secure sums
PLANS = {
    "keyed_hashing+dp+secagg": ["algorithm.name=fedalc", "algorithm.normalize_gamma=false",
                                'protocols=["keyed_hashing", "dp", "secure_aggregation"]',
                                'privacy.instance={"noise_multiplier": 2.0, "sample_rate": 0.2}',
                                'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}'],
    "dp+ckks": ["algorithm.name=fedaws", 'protocols=["dp", "ckks"]',
                'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}'],
    "local+tree": ["algorithm.name=fedavg", 'protocols=["dp"]', "training.server_optimizer.name=fedavg",
                   'privacy.local={"target_epsilon": 5.0, "clip_norm": 0.5, "batch_sample_rate": 0.1, '
                   '"max_labels_per_instance": 2}',
                   'privacy.client={"target_epsilon": 5.0, "clip_norm": 0.5, "mechanism": "tree"}'],
    "poisson secagg": ["algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]', "training.client_fraction=0.5",
                       "training.sampling=poisson", 'privacy.client={"target_epsilon": 8.0, "clip_norm": 0.5}'],
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StrictPlan(RunPlan):
    """A plan without the transitional ``plan.privacy`` shim: a plugin section is read with ``plan.part(...)`` only."""

    def __getattr__(self, name: str):
        raise AttributeError(f"{name}: read a plugin section with plan.part(...), not as an attribute")


def strict(plan: RunPlan) -> StrictPlan:
    return StrictPlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(RunPlan)})


class Shape:
    """The data's sizes a spec's ``memory`` reads (a :class:`secure_fed.memory.DataShape`'s ``labels``)."""

    labels = 50


@pytest.mark.parametrize("overrides", PLANS.values(), ids=PLANS.keys())
def test_every_spec_callable_reads_the_plan_through_its_parts(overrides):
    plan = strict(load_plan(overrides=[*SMALL, *overrides]))
    with pytest.raises(AttributeError, match="plan.part"):
        plan.privacy  # noqa: B018 - the shim is off
    for name, spec in layer_specs().items():
        if spec.validate is not None:  # every registered layer's rules run, listed or not
            assert spec.validate(plan, list(plan.protocols)) is None
        if name not in plan.protocols:
            continue
        assert spec.settings is not None
        assert dataclasses.is_dataclass(spec.settings(plan))
        if spec.describe is not None:
            lines = spec.describe(plan, 20)
            assert lines and all(isinstance(line, str) and line.startswith(name) for line in lines), lines
        for flag in (spec.row_sparse_updates, spec.public_preprocessing):
            if flag is not None:
                assert isinstance(flag(plan), bool)
        if spec.instance_bound is not None:
            assert spec.instance_bound(plan) in (None, (2, "keep_hashed"))
        if spec.memory is not None:
            for device in ("cpu", "cuda"):
                terms = spec.memory(plan, Shape(), 1000, device)
                assert all(isinstance(v, int | float) and v > 0 for v in terms.values())


def test_the_settings_hold_the_plans_parts():
    plan = strict(load_plan(overrides=[*SMALL, *PLANS["keyed_hashing+dp+secagg"]]))
    specs = layer_specs()
    dp = specs["dp"].settings(plan)
    s = plan.part(SecureAggregationConfig)
    assert dp.privacy is plan.part(PrivacyConfig) and dp.algorithm is plan.algorithm
    assert dp.encoding == (s.clip_range, int(s.frac_bits)) and dp.encoding_grid == 2.0 ** -int(s.frac_bits)
    assert dp.label_set_algorithm is True and dp.on_flower is False
    assert dp.training.rounds == plan.training.rounds and dp.training.sampling == plan.training.sampling
    assert [dp.training.cohort_size(n) for n in (1, 7, 40)] == [plan.training.cohort_size(n) for n in (1, 7, 40)]
    assert specs["secure_aggregation"].settings(plan).section is s
    assert specs["keyed_hashing"].settings(plan).section is plan.part(KeyedHashingConfig)
    ckks = specs["ckks"].settings(strict(load_plan(overrides=[*SMALL, *PLANS["dp+ckks"]])))
    assert isinstance(ckks.section, CKKSConfig) and ckks.aggregation == "uniform"
    # without secure aggregation in the stack, the dp layer has no encoding to fit its shares to
    assert specs["dp"].settings(strict(load_plan(overrides=[*SMALL, *PLANS["dp+ckks"]]))).encoding is None


def _names(tp) -> typing.Iterator[object]:
    yield tp
    for arg in typing.get_args(tp):
        yield from _names(arg)


def test_every_setting_is_typed_precisely():
    """No setting is ``Any`` (the annotations resolve against the plugin API's names)."""
    ns = {**vars(layer_settings), **{n: getattr(api, n) for n in api.__all__}}
    classes = [
        v for v in vars(layer_settings).values() if dataclasses.is_dataclass(v) and v.__module__ == layer_settings.__name__
    ]
    assert {c.__name__ for c in classes} == {"TrainingFacts", "KeyedHashingSettings", "DPSettings",
                                             "SecureAggregationSettings", "CKKSSettings"}  # fmt: skip
    for cls in classes:
        hints = typing.get_type_hints(cls, globalns=ns)
        assert set(hints) == {f.name for f in dataclasses.fields(cls)}
        for field, tp in hints.items():
            assert typing.Any not in list(_names(tp)), f"{cls.__name__}.{field}: {tp}"
    assert typing.get_type_hints(layer_settings.DPSettings, globalns=ns)["privacy"] is PrivacyConfig


CTRAN_LOCAL = [
    "algorithm.name=fedlgt", "model.family=ctran", "model.embedding_dim=8", "partition.name=iid", "partition.num_clients=4",
    'protocols=["dp"]', 'privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "batch_sample_rate": 0.5}',
]  # fmt: skip


def _with_dropout(plan: RunPlan, rate: float, auto: bool) -> RunPlan:
    ctran = dataclasses.replace(plan.model.ctran, dropout=rate, dropout_auto=auto)
    return dataclasses.replace(plan, model=dataclasses.replace(plan.model, ctran=ctran))


def test_dropout_under_dp_sgd_is_read_from_the_plans_resolved_rate():
    """The plan resolves ``auto`` to a rate (0.1) and says it was auto: DP-SGD runs without dropout whatever that
    rate, so only a rate set explicitly above 0 is refused."""
    plan = strict(load_plan(overrides=CTRAN_LOCAL))
    assert plan.model.ctran.dropout_auto and plan.model.ctran.dropout == 0.1
    validate = layer_specs()["dp"].validate
    validate(plan, ["dp"])
    validate(strict(_with_dropout(plan, 0.0, auto=False)), ["dp"])
    with pytest.raises(ValueError, match=r"model.ctran.dropout 0.1: DP-SGD's steps run without dropout"):
        validate(strict(_with_dropout(plan, 0.1, auto=False)), ["dp"])


def test_image_formats_are_the_cores():
    from secure_fed.config.schema import IMAGE_FORMATS

    assert layer_specs_module.IMAGE_FORMATS == IMAGE_FORMATS


# ---------------------------------------------------------------------------------------------- the plugin API
LAYERS_API = ROOT / "secure_fed/plugin_api/layers.py"


def test_the_layers_api_lists_each_name_once_with_its_type_and_a_comment():
    tree = ast.parse(LAYERS_API.read_text())
    typed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            typed |= {a.asname or a.name for n in node.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert set(api._LAZY) == set(api.__all__) == typed
    assert len(api.__all__) == len(set(api.__all__))
    for name, module in api._LAZY.items():  # each name is its module's own object, and says what it is
        assert getattr(api, name) is getattr(__import__(module, fromlist=[name]), name)
        assert re.search(rf'^    "{name}": "{re.escape(module)}",  # \S', LAYERS_API.read_text(), re.M), name
    with pytest.raises(AttributeError):
        api.ExperimentConfig  # noqa: B018


def test_importing_the_layers_api_and_the_specs_loads_no_torch():
    heavy = ("torch", "secure_fed.engine", "secure_fed.config.schema")
    code = ("import sys, secure_fed.plugin_api.layers, protocols.layer_specs, protocols.config_sections; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]"


def protocols_imports() -> list[tuple[str, int, str]]:
    """Every import of a secure_fed module in protocols/ (top level, in functions, under TYPE_CHECKING)."""
    found = []
    for path in sorted((ROOT / "protocols").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            found += [(path.relative_to(ROOT).as_posix(), node.lineno, m) for m in modules if m.split(".")[0] == "secure_fed"]
    return found


def test_protocols_import_secure_fed_only_through_the_plugin_api():
    found = protocols_imports()
    assert len(found) > 20  # the scan sees them
    assert [f for f in found if f[2] not in ("secure_fed.plugin_api", "secure_fed.plugin_api.layers")] == []


#: the modules whose functions receive the run's plan: the specs' callables and the settings builders
SPEC_MODULES = ("layer_specs.py", "layer_settings.py")


def test_no_protocols_function_receives_the_config():
    """No parameter under protocols/ is the run's config (``cfg``; ``config: dict`` is config.yaml's plain data), and
    every ``plan`` of the specs and settings builders is annotated ``RunPlan``."""
    bad, plans = [], 0
    for path in sorted((ROOT / "protocols").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.Lambda):
                for arg in node.args.args + node.args.kwonlyargs:
                    note = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if arg.arg in ("cfg", "config", "ucfg", "client_cfg") and note != "dict":
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {arg.arg}")
                    if re.search(r"\b(ExperimentConfig|CoreConfig)\b", note):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {arg.arg}: {note}")
                    if arg.arg == "plan" and path.name in SPEC_MODULES:  # elsewhere ``plan`` is a round's step plan
                        plans += 1
                        if note != "RunPlan":
                            bad.append(f"{path.relative_to(ROOT)}:{node.lineno} plan: {note or '(none)'}")
    assert bad == []
    assert plans >= 30


def test_a_plan_built_from_a_config_gives_the_same_settings_as_load_plan():
    """``build_plan(load_config(...))`` and ``load_plan(...)`` are one plan: the layers' settings agree."""
    from secure_fed.config import load_config

    over = [*SMALL, *PLANS["keyed_hashing+dp+secagg"]]
    a, b = (
        layer_specs()["dp"].settings(build_plan(load_config(overrides=over))),
        layer_specs()["dp"].settings(load_plan(overrides=over)),
    )
    assert (
        a.privacy.model_dump() == b.privacy.model_dump() and a.encoding == b.encoding and a.instance_divisor == b.instance_divisor
    )
