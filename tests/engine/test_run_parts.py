"""A run composed of parts (issue 44): the run object is small and has no mixins, its callbacks read a
:class:`~secure_fed.engine.run_context.RunContext` (never the run object), the run's modules import one another
without a circle, and the keys a resumed run may not change are the core's plus each layer spec's own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from secure_fed.engine import Experiment
from secure_fed.engine.callbacks import Callback
from secure_fed.engine.checkpoints import FROZEN_ON_RESUME, MOVABLE_ON_RESUME, frozen_on_resume, resume_change
from secure_fed.engine.run_context import RunContext
from secure_fed.plugin_specs import layer_specs
from tests.conftest import REPO, SMALL, small_config, small_plan

ENGINE = Path(__file__).resolve().parents[2] / "secure_fed" / "engine"
#: the modules of the run and its callbacks (and the Flower back end, which drives a run)
RUN_MODULES = ("runner", "run_", "callbacks", "checkpoints", "evaluation", "privacy_", "flower")


def engine_imports() -> dict[str, set[str]]:
    """Engine module → the engine modules it imports anywhere in its file (in functions and TYPE_CHECKING too)."""
    mods = {}
    for f in ENGINE.rglob("*.py"):
        parts = f.relative_to(ENGINE).with_suffix("").parts
        mods[".".join(p for p in parts if p != "__init__") or "__init__"] = f
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            prefix = "secure_fed.engine."
            graph[m] |= {n[len(prefix) :] for n in names if n.startswith(prefix) and n[len(prefix) :] in mods} - {m}
    return graph


def reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return False


def test_the_run_modules_import_one_another_without_a_circle():
    graph = engine_imports()
    assert "runner" in graph and "flower.client_app" in graph and "callbacks" in graph
    circles = sorted(m for m in graph if m.startswith(RUN_MODULES) and reaches(graph, m, m))
    assert circles == []


def test_the_run_object_is_small_and_has_no_mixins():
    tree = ast.parse((ENGINE / "runner.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Experiment"]
    assert cls.end_lineno - cls.lineno + 1 <= 250
    assert Experiment.__bases__ == (object,)


def test_callbacks_get_the_run_context_never_the_run(tmp_path):
    seen: list[tuple[str, object]] = []

    class Spy(Callback):
        name = "spy"

        def on_init(self, ctx):
            seen.append(("on_init", ctx))

        def on_run_start(self, ctx):
            seen.append(("on_run_start", ctx))

        def on_record(self, ctx, record, diagnostics):
            seen.append(("on_record", ctx))

        def on_round_end(self, ctx, record, diagnostics):
            seen.append(("on_round_end", ctx))

        def on_run_end(self, ctx, status):
            seen.append(("on_run_end", ctx))

        def on_release(self, ctx, status):
            seen.append(("on_release", ctx))

        def checkpoint_state(self, ctx):
            seen.append(("checkpoint_state", ctx))
            return {}

    exp = Experiment(small_plan("training.rounds=2", "output.checkpoint_every=1"), run_dir=tmp_path)
    spy = Spy()
    exp.callbacks.insert(0, spy)
    spy.on_init(exp.context())
    result = exp.run(progress=False)
    hooks = {h for h, _ in seen}
    assert hooks == {"on_init", "on_run_start", "on_record", "on_round_end", "on_run_end", "on_release", "checkpoint_state"}
    assert all(type(ctx) is RunContext for _, ctx in seen)
    assert result.summary["rounds_completed"] == 2 and (tmp_path / "private" / "checkpoints" / "final.pt").is_file()


def test_the_core_names_no_layer_section_and_each_layer_freezes_its_own():
    specs = layer_specs()
    layer_keys = {k for s in specs.values() for k in (*s.frozen_on_resume, *s.movable_on_resume)}
    assert not layer_keys & {*FROZEN_ON_RESUME, *MOVABLE_ON_RESUME}
    frozen, movable = frozen_on_resume()
    for name, section in (("dp", "privacy"), ("keyed_hashing", "keyed_hashing"), ("secure_aggregation", "secure_aggregation"),
                          ("ckks", "ckks")):  # fmt: skip
        assert (section,) in specs[name].frozen_on_resume and (section,) in frozen
    assert ("privacy", "report_gdp") in movable


def test_a_resume_may_not_change_a_layers_section_but_may_change_what_it_reports():
    base = small_plan()
    assert resume_change(base, small_plan("secure_aggregation.clip_range=7")).startswith("secure_aggregation")
    assert resume_change(base, small_plan("privacy.report_gdp=true")) is None
    assert resume_change(base, small_plan("training.rounds=9")) is None


def test_setup_phases_report_progress(tmp_path, monkeypatch):
    """The layers' one-off protocols and the algorithm's setup (label sets, index builds) run inside progress phases
    (secure_fed/progress.py prints their elapsed time once they pass 5 s)."""
    import contextlib

    from secure_fed.engine import runner

    names = []

    @contextlib.contextmanager
    def recording(name, total=None, **kw):
        names.append(name)
        yield None

    monkeypatch.setattr(runner, "phase", recording)
    runner.Experiment(small_plan('protocols=["keyed_hashing"]'), run_dir=tmp_path).setup()
    assert names == ["protocol setup", "fedalc setup"]


def test_a_spec_frees_resume_keys_only_inside_its_own_sections(monkeypatch):
    """A layer spec's ``movable_on_resume`` cannot unfreeze the core's keys or another layer's section."""
    import dataclasses

    from secure_fed.engine import checkpoints

    real = checkpoints.layer_specs()
    greedy = dataclasses.replace(next(iter(real.values())), name="greedy", frozen_on_resume=(("greedy",),),
                                 movable_on_resume=(("greedy", "x"), ("privacy", "delta"), ("dataset", "name")))  # fmt: skip
    monkeypatch.setattr(checkpoints, "layer_specs", lambda: {**real, "greedy": greedy})
    frozen, movable = checkpoints.frozen_on_resume()
    assert ("greedy", "x") in movable and ("greedy",) in frozen
    assert ("privacy", "delta") not in movable and ("dataset", "name") not in movable


def test_a_run_takes_the_plan_never_the_config(tmp_path):
    """Issue 54: the config object stays in the config package; a run is built from its plan."""
    with pytest.raises(TypeError, match="RunPlan"):
        Experiment(small_config("training.rounds=1"), run_dir=tmp_path)


def test_no_function_outside_the_config_package_receives_the_config(tmp_path):
    """The trace of ``benchmarks/config_receivers.py`` over a small run with dp and secure aggregation (the layers'
    rules, settings and memory terms included): no function of secure_fed/ outside secure_fed/config/ is called with
    the config object as an argument."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("config_receivers", REPO / "benchmarks" / "config_receivers.py")
    receivers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(receivers)
    overrides = [
        *SMALL,
        "training.rounds=1",
        "protocols=[dp,secure_aggregation]",
        "privacy.client={target_epsilon: 4, clip_norm: 1}",
    ]
    hits = receivers.trace({"small dp + secure_aggregation": overrides}, tmp_path)
    assert [k for k in hits if k.startswith("secure_fed/")] == []


# ---------------------------------------------------------------- every ``auto`` resolved once (issue 54)
def autos(value, path: str = "plan") -> list[str]:
    """The paths under ``value`` (a plan: dataclasses and pydantic sections, recursively) whose value is ``auto``."""
    import dataclasses

    from pydantic import BaseModel

    if isinstance(value, str):
        return [path] if value == "auto" else []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [p for f in dataclasses.fields(value) for p in autos(getattr(value, f.name), f"{path}.{f.name}")]
    if isinstance(value, BaseModel):
        return [p for name in type(value).model_fields for p in autos(getattr(value, name), f"{path}.{name}")]
    if isinstance(value, dict | tuple | list) or hasattr(value, "items"):
        items = value.items() if hasattr(value, "items") else enumerate(value)
        return [p for k, v in items for p in autos(v, f"{path}[{k}]")]
    return []


DP_SECAGG = ["training.rounds=1", 'protocols=["keyed_hashing", "dp", "secure_aggregation"]', "algorithm.normalize_gamma=false",
             'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}',
             'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}']  # fmt: skip
BIBTEX = ["dataset.name=bibtex", "model.name=auto", "training.precision=auto", "training.rounds=1", "evaluation.max_test=50",
          "model.hidden_dims=[16]", "model.embedding_dim=16", "model.embed_dim=16"]  # fmt: skip


#: the plugins' own ``auto`` settings, which their layers and attacks decide (not resolved in the plan yet):
#: SecAgg+'s neighbours for each round's cohort, DP-SGD's public divisor B̄, the canary audit's client count
PLUGIN_AUTOS = {
    "plan.sections[secure_aggregation].neighbors",
    "plan.sections[privacy].instance.expected_batch_size",
    "plan.sections[attacks].canary_client_audit.canaries",
}


def _old_choices(plan, ds, num_clients: int, callbacks: list[str]) -> dict[str, object]:
    """What the choice functions pick for ``plan`` (unresolved) on ``ds`` on this CPU: the values a run resolves."""
    import torch

    from secure_fed.memory import DataShape
    from secure_fed.model_choices import ctran_tokens_choice, model_choice, precision_choice, sparse_input_choice
    from secure_fed.plugin_specs import dense_update_layers
    from secure_fed.threads import threads_record
    from secure_fed.update_forms import deferred_updates

    name, prep, _ = model_choice(plan, ds)
    shape = DataShape.of(ds)
    rows = (shape.label_entries if plan.partition.name == "positive_only" else shape.train) + min(
        plan.evaluation.max_test or shape.test, shape.test
    )
    from secure_fed.engine.builders import build_algorithm

    return {
        "algorithm.loss": build_algorithm(plan, torch.device("cpu")).client_loss,
        "device": "cpu",
        "dataset.feature_kind": ds.feature_kind,
        "model.name": name,
        "model.preprocessing": prep,
        "model.sparse_input": sparse_input_choice(plan, ds, rows),
        "model.ctran.tokens": ctran_tokens_choice(plan, ds),
        "training.precision": precision_choice(plan, ds, "cpu"),
        "training.threads": threads_record(plan, num_clients, ceiling=torch.get_num_threads())["torch_threads"],
        "training.sparse_updates": not dense_update_layers(plan),
        "training.deferred_updates": deferred_updates(plan, dense_layers=dense_update_layers(plan), callbacks=callbacks),
    }


def _resolved(plan) -> dict[str, object]:
    get = {"algorithm.loss": plan.algorithm.loss,
           "device": plan.device, "dataset.feature_kind": plan.dataset.feature_kind, "model.name": plan.model.name,
           "model.preprocessing": plan.model.preprocessing, "model.sparse_input": plan.model.sparse_input,
           "model.ctran.tokens": plan.model.ctran.tokens, "training.precision": plan.training.precision,
           "training.threads": plan.training.threads, "training.sparse_updates": plan.training.sparse_updates,
           "training.deferred_updates": plan.training.deferred_updates}  # fmt: skip
    return get


def _check_resolved_run(tmp_path, plan, data_root=None):
    """Build the run of ``plan`` (every choice left ``auto``, on CPU): the run, its context and its parts hold a plan
    with no ``auto``, each field the value the choice functions pick for the loaded data, ``config_yaml`` unchanged."""
    import dataclasses

    plan = dataclasses.replace(plan, device="auto") if plan.device == "cpu" else plan
    assert {"plan.device", "plan.model.preprocessing", "plan.training.threads", "plan.algorithm.loss"} <= set(autos(plan))
    exp = Experiment(plan, run_dir=tmp_path / "run", data_root=data_root)
    assert [p for p in autos(exp.plan) if p not in PLUGIN_AUTOS] == []
    assert exp.context().plan is exp.plan
    assert exp.plan.config_yaml == plan.config_yaml  # a resume compares it
    names = [type(cb).__name__ for cb in exp.callbacks if cb.__module__.split(".")[0] != "secure_fed"]
    expected = _old_choices(dataclasses.replace(plan, device="cpu"), exp.dataset, len(exp.fed.clients), names)
    assert _resolved(exp.plan) == expected
    assert exp.local.precision == expected["training.precision"]
    assert exp.algorithm.client_loss == expected["algorithm.loss"]
    assert exp.algorithm.cfg is exp.plan.algorithm  # the algorithm holds the resolved parameters too
    assert exp.trainer.deferred_updates is expected["training.deferred_updates"]
    return exp


def test_the_default_run_holds_a_plan_with_every_auto_resolved(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU's choices")
    exp = _check_resolved_run(tmp_path, small_plan("training.precision=auto"))
    assert (exp.plan.model.name, exp.plan.model.preprocessing, exp.plan.model.sparse_input) == ("mlp", "standardize", False)
    assert exp.plan.training.threads_auto and exp.plan.training.threads_why != "training.threads"
    assert Experiment(exp.plan, run_dir=tmp_path / "again").plan == exp.plan  # a resolved plan resolves to itself
    exp.run()
    threads = exp.records.threads  # what summary.json records: the setting as written, the count resolved
    assert threads["setting"] == "auto" and threads["torch_threads"] == exp.plan.training.threads
    assert threads["why"] == exp.plan.training.threads_why


def test_a_dp_secure_aggregation_run_holds_a_plan_with_every_auto_resolved(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU's choices")
    exp = _check_resolved_run(tmp_path, small_plan(*DP_SECAGG))
    assert exp.plan.model.preprocessing == "none"  # no statistic of the private data under dp
    assert exp.plan.training.sparse_updates is False  # client-level DP clips and noises whole updates


@pytest.mark.data
def test_a_bibtex_run_holds_a_plan_with_every_auto_resolved(tmp_path, data_root):
    import torch

    from secure_fed.config import load_plan

    if torch.cuda.is_available():
        pytest.skip("checks the CPU's choices")
    exp = _check_resolved_run(tmp_path, load_plan(None, BIBTEX), data_root=str(data_root))
    assert (exp.plan.dataset.feature_kind, exp.plan.model.name, exp.plan.model.preprocessing) == (
        "sparse", "sparse_text", "rsqrt_nnz"
    )  # fmt: skip


def test_the_federation_refuses_a_plan_no_run_resolved():
    from secure_fed.algorithms.base import Algorithm
    from secure_fed.data.from_config import build_dataset
    from secure_fed.engine.builders import build_federation

    plan = small_plan()
    with pytest.raises(ValueError, match="resolved plan"):
        build_federation(plan, build_dataset(plan), Algorithm, __import__("torch").device("cpu"))


def test_ctran_tokens_auto_picks_scenes_blocks_and_the_model_reads_the_resolved_field():
    """``model.ctran.tokens: auto`` resolves to ``scene_blocks`` for Mulan scene's 294 features (moment-major tokens
    of 6), else ``chunks``; C-Tran is built from the resolved field, whatever the data set's name."""
    import dataclasses
    from types import SimpleNamespace

    from secure_fed.data.from_config import build_dataset
    from secure_fed.engine.builders import build_ctran
    from secure_fed.model_choices import ctran_tokens_choice

    plan = small_plan("model.family=ctran", "algorithm.name=fedctran", "partition.name=iid", "dataset.synthetic.num_features=294")
    assert plan.model.ctran.tokens == "auto"
    scene = SimpleNamespace(name="scene", num_features=294)
    assert ctran_tokens_choice(plan, scene) == "scene_blocks"
    assert ctran_tokens_choice(plan, SimpleNamespace(name="scene", num_features=293)) == "chunks"
    assert ctran_tokens_choice(plan, SimpleNamespace(name="yeast", num_features=294)) == "chunks"
    ds = build_dataset(plan)  # synthetic, 294 features
    for tokens, want in (("scene_blocks", (6, True)), ("chunks", (plan.model.ctran.token_size, False))):
        resolved = dataclasses.replace(plan, model=dataclasses.replace(plan.model, name="mlp", ctran=dataclasses.replace(
            plan.model.ctran, tokens=tokens)))  # fmt: skip
        t = build_ctran(resolved, ds).tokens
        assert (t.token_size, t.feature_major) == want


@pytest.mark.parametrize("extra", [(), ("model.preprocessing=standardize",)])
def test_a_nodes_copy_of_the_run_holds_no_clients_rows_and_reads_what_the_eager_run_holds(tmp_path, extra):
    """``node_copy`` (a Flower node's copy of the run): every client's rows are a :class:`SharedRows`, built
    when read, equal to the eager run's tensors (compared exactly: the same preprocessing of the same rows)."""
    import torch

    from secure_fed.algorithms.base import SharedRows

    plan = small_plan(*extra)
    eager = Experiment(plan, run_dir=tmp_path / "eager")
    lazy = Experiment(plan, run_dir=tmp_path / "lazy", node_copy=True)
    assert not any(isinstance(c.__dict__["_x"], SharedRows) for c in eager.fed.clients)
    assert all(isinstance(c.__dict__["_x"], SharedRows) for c in lazy.fed.clients)
    assert len(lazy.fed.clients) == len(eager.fed.clients) > 1
    for a, b in zip(eager.fed.clients, lazy.fed.clients, strict=True):
        assert b.num_examples == a.num_examples
        assert b.x.dtype == a.x.dtype and torch.equal(b.x, a.x)
        assert torch.equal(b.with_rows_read().x, a.x)
