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
