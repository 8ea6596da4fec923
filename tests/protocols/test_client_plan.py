"""A remote node runs the round's client plan only if it is the plan its own copy of the run's config gives
(``ProtocolStack.check_client_plan``): the server chooses the plan (the clip norm, the noise share, which round a
mask belongs to), so a plan with a step dropped, weakened, reordered, added or pointed at another round is refused.

The honest plans here are the ones the server's round sessions build; each tampered plan changes one thing."""

from __future__ import annotations

import copy
import json
import math

import pytest

from protocols.base import AtLeast
from secure_fed.engine import Experiment
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.layers import plan_mismatch
from tests.conftest import small_config

SHARES = ["protocols=[dp, secure_aggregation]", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5, noise: clients}"]


def _server_plan(exp: Experiment, round_idx: int) -> list[dict]:
    """The plan the server's round session sends (as JSON, the way it travels to a node)."""
    base = RoundSession(cohort=list(range(len(exp.fed.clients))), theta=exp.theta, W=exp.W, weighting="uniform")
    return json.loads(json.dumps(exp.stack.open_round(round_idx, base).client_plan()))


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    exp = Experiment(small_config(*SHARES), run_dir=tmp_path_factory.mktemp("shares"))
    node = Experiment(small_config(*SHARES), run_dir=tmp_path_factory.mktemp("node"))  # the node's own copy
    return exp, node, _server_plan(exp, 2)


def test_the_server_plan_is_what_the_node_expects(shares):
    exp, node, plan = shares
    assert [s["op"] for s in plan] == ["dp.clip", "layer:dp.noise_share_step", "layer:secure_aggregation.mask_step"]
    assert plan[0] == {"op": "dp.clip", "clip_norm": 0.5}
    assert plan[1]["label"] == "noise share r2" and plan[2]["secagg_round"] == 2
    unit = exp.stack.by_name()["dp"].units["client"]
    t = exp.stack.open_round(3, RoundSession(cohort=list(range(len(exp.fed.clients))), theta=exp.theta, W=exp.W,
                                             weighting="uniform")).min_summands  # fmt: skip
    assert plan[1]["std"] == pytest.approx(unit.sigma * 0.5 / math.sqrt(t))  # σ·S/√t, an independent computation
    node.stack.check_client_plan(plan, round_idx=2)  # passes


def _tampered(plan: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}

    def variant(name, fn):
        p = copy.deepcopy(plan)
        fn(p)
        out[name] = p

    variant("larger clip", lambda p: p[0].update(clip_norm=5.0))
    variant("a weight cap not configured", lambda p: p[0].update(weight_cap=100.0))
    variant("clip dropped", lambda p: p.pop(0))
    variant("noise dropped", lambda p: p.pop(1))
    variant("mask dropped", lambda p: p.pop(2))
    variant("noise below any cohort's", lambda p: p[1].update(std=p[1]["std"] / 100))
    variant("noise of another round", lambda p: p[1].update(label="noise share r1"))
    variant("no rows noised", lambda p: p[1].update(rows=None))
    variant("mask of another round", lambda p: p[2].update(secagg_round=1))
    variant("other weighting", lambda p: p[2].update(weighting="num_examples"))
    variant("noise before the clip", lambda p: p.insert(0, p.pop(1)))
    variant("an extra step", lambda p: p.append({"op": "dp.clip", "clip_norm": 0.5}))
    variant("a string for a number", lambda p: p[0].update(clip_norm="0.5"))
    return out


@pytest.mark.parametrize("name", list(_tampered([{"op": "dp.clip", "weight_cap": 1}, {"std": 1.0}, {}])))
def test_a_tampered_plan_is_refused(shares, name):
    _, node, plan = shares
    bad = _tampered(plan)[name]
    assert bad != plan
    with pytest.raises(PermissionError, match="the server's plan for round 2"):
        node.stack.check_client_plan(bad, round_idx=2)


def test_the_plan_is_checked_against_the_round_the_node_is_asked_to_train(shares):
    _, node, plan = shares
    with pytest.raises(PermissionError, match="noise share r2"):
        node.stack.check_client_plan(plan, round_idx=3)


def test_a_larger_noise_share_passes_and_the_floor_is_all_clients(shares):
    """A node cannot know how many updates the round's sum holds: it bounds the share below by σ·S/√N (N clients)."""
    exp, node, plan = shares
    unit = node.stack.by_name()["dp"].units["client"]
    floor = unit.sigma * 0.5 / math.sqrt(len(exp.fed.clients))
    for std, ok in ((plan[1]["std"] * 3, True), (floor, True), (floor * (1 - 1e-9), False)):
        p = copy.deepcopy(plan)
        p[1]["std"] = std
        assert (plan_mismatch(p, _expected(node, 2)) is None) is ok, std


def _expected(exp: Experiment, round_idx: int) -> list[dict]:
    expected: list[dict] = []
    for layer in exp.stack.layers:
        expected = layer.client_plan_steps(expected, round_idx=round_idx)
    return expected


@pytest.mark.parametrize(
    "overrides, ops",
    [
        (["protocols=[dp]", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5}"], ["dp.clip"]),
        (["protocols=[ckks]"], ["layer:ckks.encrypt_step"]),
        (["protocols=[keyed_hashing]"], []),
        (
            [
                "protocols=[dp]",
                "algorithm.normalize_gamma=false",
                "privacy.instance={noise_multiplier: 1.0, clip_norm: 1.0, sample_rate: 0.5}",
            ],
            [],
        ),
    ],
    ids=["client-dp", "ckks", "keyed-hashing", "instance-dp"],
)
def test_other_stacks_plans_pass_and_an_added_step_is_refused(overrides, ops, tmp_path):
    exp = Experiment(small_config(*overrides), run_dir=tmp_path / "s")
    node = Experiment(small_config(*overrides), run_dir=tmp_path / "n")
    plan = _server_plan(exp, 0)
    assert [s["op"] for s in plan] == ops
    node.stack.check_client_plan(plan, round_idx=0)
    with pytest.raises(PermissionError, match="where this run's layers ask for"):
        node.stack.check_client_plan([*plan, {"op": "dp.clip", "clip_norm": 9.0}], round_idx=0)


def test_at_least_is_a_floor_and_types_must_match():
    expected = [{"op": "x", "std": AtLeast(1.0), "n": 3, "w": "uniform"}]
    assert plan_mismatch([{"op": "x", "std": 1.0, "n": 3, "w": "uniform"}], expected) is None
    assert plan_mismatch([{"op": "x", "std": 2, "n": 3, "w": "uniform"}], expected) is None
    for bad in ({"std": 0.5}, {"std": True}, {"std": "2"}, {"std": float("nan")}, {"n": 3.0}, {"n": True}, {"w": "x"}):
        assert plan_mismatch([{"op": "x", "std": 1.0, "n": 3, "w": "uniform", **bad}], expected) is not None, bad
