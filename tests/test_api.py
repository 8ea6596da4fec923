"""The Python API (``secure_fed/api.py``): ``secure_fed.load_config``, ``secure_fed.load_plan`` and ``secure_fed.run``
take a path, a mapping, a plan or a loaded config, run the user's callbacks with the built-in ones, and return the
released metrics and privacy report; bad input raises the CLI's one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import secure_fed
from secure_fed.errors import ConfigError, SecureFedError
from tests.conftest import SMALL

REPO = Path(__file__).resolve().parents[1]


def _doc(*extra: str) -> dict:
    """The SMALL overrides as a nested mapping (what a user writes in Python)."""
    out: dict = {}
    for item in (*SMALL, *extra):
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[last] = yaml.safe_load(value)
    return out


def test_a_mapping_loads_as_the_yaml_document_it_stands_for(tmp_path):
    doc = _doc("algorithm.name=fedavg")
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(doc))
    from_dict, from_file = secure_fed.load_config(doc), secure_fed.load_config(tmp_path / "exp.yaml")
    assert from_dict == from_file and from_dict.algorithm.name == "fedavg" and from_dict.training.rounds == 4
    again = secure_fed.load_config(from_dict, ["training.rounds=2"])  # a loaded config with overrides
    assert again.training.rounds == 2 and from_dict.training.rounds == 4
    assert secure_fed.load_config(from_dict) is from_dict


def test_a_plan_loads_as_itself_or_is_planned_again_with_overrides():
    """``secure_fed.load_plan`` (the config package's): a plan without overrides is the plan; with overrides its
    config is loaded again with them (the plan is immutable)."""
    plan = secure_fed.load_plan(_doc("algorithm.name=fedavg"))
    assert secure_fed.load_plan(plan) is plan and plan.training.rounds == 4 and plan.algorithm.name == "fedavg"
    again = secure_fed.load_plan(plan, ["training.rounds=2"])
    assert again.training.rounds == 2 and plan.training.rounds == 4 and again.algorithm.name == "fedavg"
    assert secure_fed.load_plan(secure_fed.load_config(_doc()), ["training.rounds=3"]).training.rounds == 3


def test_a_bad_mapping_raises_the_one_line_error():
    with pytest.raises(ConfigError) as e:
        secure_fed.load_config({"training": {"roundz": 3}})
    assert "training.roundz" in str(e.value) and "\n" not in str(e.value)


class RoundSpy(secure_fed.Callback):
    name = "round_spy"

    def __init__(self):
        self.rounds, self.epsilons = [], []

    def on_round_end(self, ctx, record, diagnostics) -> None:
        self.rounds.append(record["round"])
        self.epsilons.append(record["privacy"]["epsilon"])


def test_run_with_a_mapping_and_a_callback(tmp_path):
    spy = RoundSpy()
    doc = _doc("training.rounds=2", "algorithm.name=fedavg", "protocols=[dp]",
               'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}')  # fmt: skip
    result = secure_fed.run(doc, callbacks=[spy], run_dir=tmp_path / "run")
    assert result.status == "completed" and result.run_dir == tmp_path / "run"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert result.metrics == summary["final"] and "P@1" in result.metrics
    assert result.privacy == summary["privacy"] and 0 < result.privacy["epsilon"] < float("inf")
    assert spy.rounds == [1, 2] and spy.epsilons[-1] == pytest.approx(result.privacy["epsilon"])
    assert [json.loads(line)["round"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    with pytest.raises(SecureFedError, match="already holds a run"):
        secure_fed.run(doc, run_dir=tmp_path / "run")


def test_import_secure_fed_stays_light():
    code = "import sys, secure_fed; secure_fed.load_config({}); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_the_getting_started_python_example_runs(tmp_path):
    """The docs' example, as printed (the embedded default at 5 rounds), in an empty directory."""
    page = (REPO / "docs" / "getting-started.md").read_text()
    code = page.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    p1, eps, run_dir = out.stdout.split()
    assert 0 <= float(p1) <= 100 and eps == "inf" and (tmp_path / run_dir / "summary.json").is_file()
