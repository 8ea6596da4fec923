"""``training.threads`` (secure_fed.threads): what ``auto`` picks from the CPUs this process may use and the run's
other processes, that a run trains at the pick and puts torch's count back, that ``validate`` and summary.json say
what was picked, and that the CLI and the API set OpenMP's wait policy before torch is imported, unless the user did."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from secure_fed import threads
from secure_fed.cli import main
from secure_fed.errors import ConfigError
from tests.conftest import REPO, SMALL, small_plan


@pytest.mark.parametrize("value", ["auto", 1, 2, 1024])
def test_the_setting_takes_auto_or_a_count(value):
    assert small_plan(f"training.threads={value}").training.threads == value
    assert small_plan().training.threads == "auto"  # the default


@pytest.mark.parametrize("value", ["0", "1025", "two", "2.5", "true", "-1"])
def test_a_bad_thread_count_is_one_error_line(value, capsys):
    with pytest.raises(ConfigError, match="training.threads: give auto or a whole number from 1 to 1024"):
        small_plan(f"training.threads={value}")
    assert main(["validate", "--set", f"training.threads={value}", str(REPO / "secure_fed/config/default.yaml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "training.threads" in err[0]


@pytest.mark.parametrize(
    ("cpus", "others", "ceiling", "expected"),
    [
        (2, 0, None, 1),  # the project's 2-core machine: one thread, one core for the rest
        (1, 0, None, 1),
        (16, 0, None, 15),
        (16, 0, 8, 8),  # torch's count before the run (a physical-core count, OMP_NUM_THREADS, a worker's share)
        (16, 0, 1, 1),
        (8, 3, None, 4),  # Flower's nodes keep 3 CPUs busy
        (4, 4, None, 1),
    ],
)
def test_auto_threads(cpus, others, ceiling, expected):
    n, why = threads.auto_threads(cpus=cpus, others=others, ceiling=ceiling)
    assert n == expected
    assert f"{cpus} usable CPU" in why
    assert ("one left" in why) == (cpus - others > 1)


def test_auto_reads_the_affinity_and_flower_nodes(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert threads.usable_cpus() == 8
    assert threads.threads_record(small_plan(), 8)["torch_threads"] == 7
    flower = small_plan("backend=flower", "flower.num_supernodes=3")
    record = threads.threads_record(flower, 8)
    assert (record["torch_threads"], record["cpus"]) == (4, 8)  # 8 − 3 nodes' CPUs − 1
    assert "3 for the run's other processes" in record["why"]
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    assert threads.threads_record(small_plan(), 8)["torch_threads"] == 1
    assert threads.threads_record(small_plan("training.threads=2"), 8)["torch_threads"] == 2  # a number as given


def test_the_environment_ceiling_is_a_positive_omp_num_threads():
    assert threads.env_threads_ceiling({"OMP_NUM_THREADS": "3"}) == 3
    assert threads.env_threads_ceiling({}) is None
    assert threads.env_threads_ceiling({"OMP_NUM_THREADS": "0"}) is None
    assert threads.env_threads_ceiling({"OMP_NUM_THREADS": "4,2"}) is None  # nested levels: torch's default then


def test_the_wait_policy_is_set_unless_the_user_set_it():
    env: dict[str, str] = {}
    assert threads.set_wait_policy(env, torch_imported=False) == "secure-fed"
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "active"}
    assert threads.set_wait_policy(env, torch_imported=False) == "user" and env == {"OMP_WAIT_POLICY": "active"}
    env = {"GOMP_SPINCOUNT": "10000"}  # libgomp: the user's spin count overrides the policy's, so leave both alone
    assert threads.set_wait_policy(env, torch_imported=False) == "user" and "OMP_WAIT_POLICY" not in env
    env = {}
    assert threads.set_wait_policy(env, torch_imported=True) == "too late" and env == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_a_run_trains_at_the_pick_records_it_and_puts_the_count_back(tmp_path, monkeypatch):
    import torch

    from secure_fed.engine import Experiment
    from secure_fed.engine.callbacks import Callback

    seen = []

    class Spy(Callback):
        def on_round_end(self, ctx, record, diagnostics):
            seen.append(torch.get_num_threads())

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(4)))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        exp = Experiment(small_plan("training.rounds=2"), run_dir=tmp_path / "run", callbacks=[Spy()])
        exp.run(progress=False)
        assert seen == [3, 3]  # auto on 4 CPUs would be 3 or 4: the ceiling (torch's 3) keeps 3
        assert torch.get_num_threads() == 3
        seen.clear()
        exp = Experiment(small_plan("training.rounds=2", "training.threads=2"), run_dir=tmp_path / "two", callbacks=[Spy()])
        exp.run(progress=False)
        assert seen == [2, 2] and torch.get_num_threads() == 3  # put back after the run
    finally:
        torch.set_num_threads(before)
    record = json.loads((tmp_path / "two" / "summary.json").read_text())["threads"]
    assert record["setting"] == 2 and record["torch_threads"] == 2 and record["cpus"] == 4
    assert set(record["wait_policy"]) == {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "set_by"}


def test_validate_prints_the_pick(capsys, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["validate", str(REPO / "secure_fed/config/default.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    line = next(o for o in out if o.startswith("threads: "))
    assert line.startswith("threads: auto → 1 torch thread (2 usable CPUs, one left for the rest of the machine); ")
    assert "OMP_WAIT_POLICY=" in line
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the count torch would start with
    assert main(["validate", str(REPO / "secure_fed/config/default.yaml")]) == 0
    line = next(o for o in capsys.readouterr().out.splitlines() if o.startswith("threads: "))
    assert line.startswith("threads: auto → 3 torch threads (8 usable CPUs, one left for the rest of the machine; capped at ")


#: run in a fresh interpreter: note OMP_WAIT_POLICY when torch is first imported, run the CLI (SMALL, 1 round), then
#: start a child and print what it sees
PROBE = """
import importlib.abc, json, os, subprocess, sys
seen = {}
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and "torch" not in seen:
            seen["torch"] = os.environ.get("OMP_WAIT_POLICY")
        return None
sys.meta_path.insert(0, Watch())
from secure_fed.cli import main
code = main(["run", "--out", sys.argv[1], *[x for o in json.loads(sys.argv[2]) for x in ("--set", o)]])
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                       capture_output=True, text=True).stdout.strip()
print(json.dumps({"code": code, "at_torch_import": seen.get("torch"), "child": child}))
"""


@pytest.mark.parametrize(("user", "expected", "set_by"), [(None, "PASSIVE", "secure-fed"), ("ACTIVE", "ACTIVE", "user")])
def test_the_cli_sets_the_wait_policy_before_torch_and_its_children_inherit_it(tmp_path, user, expected, set_by):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(REPO)
    if user:
        env["OMP_WAIT_POLICY"] = user
    overrides = json.dumps([*SMALL, "training.rounds=1", "evaluation.every=1"])
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "run"), overrides], cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "at_torch_import": expected, "child": expected}
    record = json.loads((tmp_path / "run" / "summary.json").read_text())["threads"]
    assert record["wait_policy"]["OMP_WAIT_POLICY"] == expected and record["wait_policy"]["set_by"] == set_by


def test_the_api_sets_the_wait_policy_before_torch(tmp_path):
    code = "import os, secure_fed, sys; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.split() == ["PASSIVE", "False"]
