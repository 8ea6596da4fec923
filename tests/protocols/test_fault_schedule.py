"""The scripted SecAgg+ fault schedule (protocols.secagg.fault_schedule): its file, its per-stage dropped sets, its
refusals (one error line through the CLI), and the layer's run under it = the random-dropout run with the same sets."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from protocols.secagg.fault_schedule import STAGES, load_fault_schedule, parse_fault_schedule
from secure_fed.errors import ConfigError
from tests.conftest import SMALL, small_plan

EXAMPLE = {
    "nodes": 8,
    "events": [
        {"round": 1, "stage": "advertise", "kill": [2, 5]},
        {"round": 2, "stage": "unmask", "kill": [0]},
        {"round": 3, "stage": "superlink"},
    ],
}


def test_the_example_file_loads_and_drops_whole_nodes_from_their_stage_on(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(EXAMPLE))
    s = load_fault_schedule(f)
    assert s.nodes == 8 and s.to_dict() == EXAMPLE
    (tmp_path / "s.json").write_text(json.dumps(EXAMPLE))
    assert load_fault_schedule(tmp_path / "s.json") == s
    cohort = list(range(40))
    # round 1 of the file is the layer's round_idx 0: nodes 2 and 5 hold clients 2, 10, ..., 5, 13, ...
    d0 = s.drops(0, cohort)
    on_2_or_5 = {c for c in cohort if c % 8 in (2, 5)}
    assert all(d0[st] == on_2_or_5 for st in STAGES) and len(on_2_or_5) == 10
    d1 = s.drops(1, cohort)
    assert d1["advertise"] == d1["share"] == d1["input"] == set() and d1["unmask"] == {0, 8, 16, 24, 32}
    assert s.drops(2, cohort) == {st: set() for st in STAGES} and s.superlink_killed(2) and not s.superlink_killed(1)
    # only the cohort's clients: a node's clients outside the round are not "dropped"
    assert s.drops(1, [1, 3, 8])["unmask"] == {8}
    assert s.kills(0) == {2: "advertise", 5: "advertise"} and s.kills(5) == {}


def test_a_share_kill_leaves_the_advertisement_in():
    s = parse_fault_schedule({"nodes": 4, "events": [{"round": 2, "stage": "share", "kill": [3]}]})
    d = s.drops(1, range(12))
    assert d["advertise"] == set() and d["share"] == d["input"] == d["unmask"] == {3, 7, 11}


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ([1, 2], "expected a mapping"),
        ({"events": []}, "'nodes' is missing"),
        ({"nodes": 0, "events": []}, "at least 1"),
        ({"nodes": 2.5, "events": []}, "whole number"),
        ({"nodes": True, "events": []}, "whole number"),
        ({"nodes": 4, "events": [], "seed": 1}, "unknown key 'seed'"),
        ({"nodes": 4, "events": {"round": 1}}, "must be a list"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "shares", "kill": [1]}]}, "stage 'shares'"),
        ({"nodes": 4, "events": [{"round": 0, "stage": "share", "kill": [1]}]}, "at least 1"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "share", "kill": [4]}]}, "node 4 does not exist"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "share", "kill": [-1]}]}, "at least 0"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "share", "kill": []}]}, "non-empty list"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "share"}]}, "non-empty list"),
        ({"nodes": 4, "events": [{"round": 1, "kill": [1]}]}, "needs 'round' and 'stage'"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "share", "kill": [1], "at": 2}]}, "unknown key 'at'"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "superlink", "kill": [1]}]}, "not nodes"),
        ({"nodes": 4, "events": [{"round": 1, "stage": "superlink"}, {"round": 1, "stage": "superlink"}]}, "already"),
        (
            {"nodes": 4, "events": [{"round": 1, "stage": "share", "kill": [1]}, {"round": 1, "stage": "unmask", "kill": [1]}]},
            "node 1 is already killed in round 1",
        ),
        ({"nodes": 4, "events": [{"round": 1, "stage": "share", "kill": [2, 2]}]}, "already killed"),
    ],
)
def test_a_malformed_schedule_is_refused_naming_the_entry(raw, needle):
    with pytest.raises(ConfigError, match=None) as e:
        parse_fault_schedule(raw)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("s.yaml", "nodes: 4\nevents:\n  - {round: 1, stage: input, kill: [7]}\n", "node 7 does not exist"),
        ("s.yaml", "nodes: [4\n", "not valid YAML"),
        ("s.json", "{nodes: 4}", "not valid JSON"),
        ("missing.yaml", None, "no such file"),
    ],
)
def test_a_bad_schedule_file_is_one_error_line_through_the_cli(tmp_path, name, content, needle):
    from tests.config.test_bad_input import assert_one_error_line, cli

    f = tmp_path / name
    if content is not None:
        f.write_text(content)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("protocols: [secure_aggregation]\n")
    sets = [a for s in SMALL for a in ("--set", s)]
    code, _, err = cli("validate", str(cfg), *sets, "--set", f"secure_aggregation.fault_schedule={f}")
    assert_one_error_line(code, err, "secure_aggregation.fault_schedule", needle)
    run_dir = tmp_path / "run"
    code, _, err = cli("run", str(cfg), *sets, "--set", f"secure_aggregation.fault_schedule={f}", "--set",
                       f"output.dir={run_dir}")  # fmt: skip
    assert_one_error_line(code, err, needle)
    assert not run_dir.exists() or not any(run_dir.rglob("*.jsonl"))  # nothing written


def test_a_schedule_and_a_random_dropout_together_are_one_error_line(tmp_path):
    from tests.config.test_bad_input import assert_one_error_line, cli

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"nodes": 4, "events": []}))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("protocols: [secure_aggregation]\n")
    sets = [a for s in SMALL for a in ("--set", s)]
    code, _, err = cli("validate", str(cfg), *sets, "--set", f"secure_aggregation.fault_schedule={f}", "--set",
                       "secure_aggregation.dropout=0.1")  # fmt: skip
    assert_one_error_line(code, err, "fault_schedule", "dropout 0.1", "both set")
    code, _, err = cli("validate", str(cfg), *sets, "--set", f"secure_aggregation.fault_schedule={f}")
    assert code == 0, err


def test_a_schedule_for_another_number_of_flower_nodes_is_refused(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"nodes": 4, "events": []}))
    sets = ("protocols=[secure_aggregation]", f"secure_aggregation.fault_schedule={f}", "backend=flower")
    with pytest.raises(ConfigError, match="flower.num_supernodes is 5"):
        small_plan(*sets, "flower.num_supernodes=5")
    assert small_plan(*sets, "flower.num_supernodes=4").flower.num_supernodes == 4


# ---------------------------------------------------------------- the layer under a schedule = the random path


def _run_recording_drops(tmp_path, monkeypatch, *extra):
    """An in-process run of the secure_aggregation layer; returns (experiment, result, each round's dropped sets)."""
    from protocols.secagg import layer as layer_mod
    from secure_fed.engine import Experiment

    seen: dict[int, dict[str, set[int]]] = {}
    real = layer_mod._SecAggRound.__init__

    def spy(self, layer, round_idx, inner):
        real(self, layer, round_idx, inner)
        seen[round_idx] = {st: set(v) for st, v in self.drops.items()}

    monkeypatch.setattr(layer_mod._SecAggRound, "__init__", spy)
    # the same graph and threshold in both runs: a public graph, and δ for the bounds above both runs' dropout terms
    common = ("protocols=[secure_aggregation]", "training.rounds=6", "secure_aggregation.graph_seed=3",
              "secure_aggregation.dropout_bound=0.45")  # fmt: skip
    exp = Experiment(small_plan(*common, *extra), run_dir=tmp_path)
    return exp, exp.run(progress=False), seen


def _metrics(run_dir) -> list[dict]:
    drop = {"wall_seconds", "secagg_setup_s", "secagg_mask_s", "secagg_unmask_s"}
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in rec.items() if k not in drop and not k.endswith("_s")} for rec in lines]


def test_the_layer_under_a_schedule_runs_exactly_as_the_random_path_with_the_same_dropped_sets(tmp_path, monkeypatch):
    exp_a, res_a, drops_a = _run_recording_drops(tmp_path / "random", monkeypatch, "secure_aggregation.dropout=0.05")
    assert any(any(v) for d in drops_a.values() for v in d.values()), "the random draws dropped nobody: pick another rate"
    # the same sets as a schedule: one client per node, each killed at the first stage the random draw dropped it
    n = len(exp_a.fed.clients)
    events = []
    for r, d in sorted(drops_a.items()):
        first: dict[str, list[int]] = {}
        for cid in sorted(set().union(*d.values())):
            first.setdefault(next(st for st in STAGES if cid in d[st]), []).append(cid)
        events += [{"round": r + 1, "stage": st, "kill": ids} for st, ids in first.items()]
    f = tmp_path / "schedule.yaml"
    f.write_text(yaml.safe_dump({"nodes": n, "events": events}))
    exp_b, res_b, drops_b = _run_recording_drops(tmp_path / "scheduled", monkeypatch, f"secure_aggregation.fault_schedule={f}")
    for r in drops_a:  # the schedule's sets: the random ones made cumulative (a client sends nothing after it drops)
        for i, st in enumerate(STAGES):
            assert drops_b[r][st] == set().union(*(drops_a[r][s] for s in STAGES[: i + 1])), (r, st)
    # rounds that completed with clients dropped and rounds that aborted: both paths are compared
    assert 0 < res_a.summary["rounds_aborted"] < 6 and any(r.get("secagg_dropped") for r in exp_a.diagnostics)
    assert res_a.summary["status"] == res_b.summary["status"]
    assert res_a.summary["rounds_aborted"] == res_b.summary["rounds_aborted"]
    assert _metrics(tmp_path / "random") == _metrics(tmp_path / "scheduled")
    theta_a, theta_b = exp_a.theta, exp_b.theta
    assert theta_a.keys() == theta_b.keys() and all(torch.equal(theta_a[k], theta_b[k]) for k in theta_a)
    assert torch.equal(exp_a.W, exp_b.W)
