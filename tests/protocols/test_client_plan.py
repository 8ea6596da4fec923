"""A remote node runs the round's client plan only if it is the plan its own copy of the run's config gives
(``ProtocolStack.check_client_plan``): the server chooses the plan (the clip norm, the noise share, which round a
mask belongs to), so a plan with a step dropped, weakened, reordered, added or pointed at another round is refused.

The honest plans here are the ones the server's round sessions build; each tampered plan changes one thing."""

from __future__ import annotations

import copy
import json
import math

import pytest

from protocols.config_sections import SecureAggregationConfig
from secure_fed.engine import Experiment
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.layers import Bounds, plan_mismatch
from tests.conftest import small_plan

SHARES = ["protocols=[dp, secure_aggregation]", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5, noise: clients}"]


def _server_plan(exp: Experiment, round_idx: int) -> list[dict]:
    """The plan the server's round session sends (as JSON, the way it travels to a node)."""
    base = RoundSession(cohort=list(range(len(exp.fed.clients))), theta=exp.theta, W=exp.W, weighting="uniform")
    return json.loads(json.dumps(exp.stack.open_round(round_idx, base).client_plan()))


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    exp = Experiment(small_plan(*SHARES), run_dir=tmp_path_factory.mktemp("shares"))
    node = Experiment(small_plan(*SHARES), run_dir=tmp_path_factory.mktemp("node"))  # the node's own copy
    return exp, node, _server_plan(exp, 2)


def test_the_server_plan_is_what_the_node_expects(shares):
    exp, node, plan = shares
    assert [s["op"] for s in plan] == ["dp.clip", "layer:dp.noise_share_step", "layer:secure_aggregation.mask_step"]
    assert plan[0] == {"op": "dp.clip", "clip_norm": 0.5}
    assert plan[1]["label"] == "noise share r2" and plan[2]["secagg_round"] == 2
    unit = exp.stack.by_name()["dp"].units["client"]
    # the SecAgg threshold of a complete graph over the whole cohort at this size: ⌈threshold · n⌉
    t = math.ceil(exp.plan.part(SecureAggregationConfig).threshold * len(exp.fed.clients))
    assert plan[1]["std"] == pytest.approx(unit.sigma * 0.5 / math.sqrt(t), rel=1e-12)  # σ·S/√t
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


def test_the_noise_share_range_without_a_threshold_is_all_clients_to_one(shares):
    """A node that knows no threshold for the round bounds the share between σ·S/√N (no sum holds more than the
    federation's N clients) and σ·S (a sum holds at least one update); ±1e-9 relative."""
    exp, node, plan = shares
    unit = node.stack.by_name()["dp"].units["client"]
    floor, top = unit.sigma * 0.5 / math.sqrt(len(exp.fed.clients)), unit.sigma * 0.5
    for std, ok in ((plan[1]["std"] * 1.5, True), (floor, True), (top, True), (floor * (1 - 1e-8), False),
                    (top * (1 + 1e-8), False), (float("inf"), False), (1e300, False), (10**400, False)):  # fmt: skip
        p = copy.deepcopy(plan)
        p[1]["std"] = std
        assert (plan_mismatch(p, _expected(node, 2)) is None) is ok, std


def test_a_node_holding_the_secagg_threshold_bounds_the_share_by_it(shares):
    """Under secure aggregation the node learned the round's threshold t at advertise (checked against its config
    there): the share must be at least σ·S/√t, the server's own value (σ·S/√N would let a server that told it a
    larger sum lower the noise)."""
    exp, node, plan = shares
    layer = node.stack.by_name()["secure_aggregation"]
    cid = 0
    n = len(exp.fed.clients)
    t = math.ceil(node.plan.part(SecureAggregationConfig).threshold * n)  # the complete graph at this size: n − 1 neighbours
    layer.client_stage({"secagg": "advertise", "secagg_round": 2, "secagg_neighbours": [c for c in range(n) if c != cid],
                        "secagg_threshold": t}, node.fed.clients[cid])  # fmt: skip
    try:
        node.stack.check_client_plan(plan, round_idx=2, cid=cid)
        unit = node.stack.by_name()["dp"].units["client"]
        assert plan[1]["std"] == pytest.approx(unit.sigma * 0.5 / math.sqrt(t), rel=1e-12)
        weaker = copy.deepcopy(plan)
        weaker[1]["std"] = plan[1]["std"] * 0.999
        assert plan_mismatch(weaker, _expected(node, 2)) is None  # above σS/√N: a node without t would take it
        with pytest.raises(PermissionError, match="outside the"):
            node.stack.check_client_plan(weaker, round_idx=2, cid=cid)
        node.stack.check_client_plan(weaker, round_idx=2, cid=cid + 1)  # another client of the node holds no t
    finally:
        layer._round_clients.clear()


def test_a_node_refuses_a_secagg_threshold_its_config_does_not_give(shares):
    exp, node, _ = shares
    layer = node.stack.by_name()["secure_aggregation"]
    n = len(exp.fed.clients)
    t = math.ceil(node.plan.part(SecureAggregationConfig).threshold * n)
    for bad in (t - 1, t + 1):
        with pytest.raises(PermissionError, match=f"threshold {bad} is not the {t}"):
            layer.client_stage({"secagg": "advertise", "secagg_round": 2, "secagg_neighbours": list(range(1, n)),
                                "secagg_threshold": bad}, node.fed.clients[0])  # fmt: skip
    assert layer._round_clients == {}


@pytest.mark.parametrize("plan", [None, {}, "", [1], {"op": "dp.clip"}, [{"op": 3}], [{"clip_norm": 0.5}], [[]]])
def test_a_malformed_plan_is_one_clear_refusal(shares, plan):
    _, node, _ = shares
    with pytest.raises(PermissionError, match="is not a list of steps|names the steps"):
        node.stack.check_client_plan(plan, round_idx=2)


def test_an_empty_cohort_plan_is_plain_json(tmp_path):
    """A Poisson cohort may be empty: under CKKS the sum then holds no update, and the plan is still plain values."""
    exp = Experiment(small_plan("protocols=[dp, ckks]", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5, "
                                  "noise: server}", "ckks.encrypt=[all]"), run_dir=tmp_path)  # fmt: skip
    base = RoundSession(cohort=[], theta=exp.theta, W=exp.W, weighting="uniform")
    plan = json.loads(json.dumps(exp.stack.open_round(0, base).client_plan()))
    exp.stack.check_client_plan(plan, round_idx=0)


def _expected(exp: Experiment, round_idx: int) -> list[dict]:
    expected: list[dict] = []
    for layer in exp.stack.layers:
        if (steps := layer.clients().plan_steps) is not None:
            expected = steps(expected, round_idx=round_idx, on_node=True)  # a node holding no t
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
    exp = Experiment(small_plan(*overrides), run_dir=tmp_path / "s")
    node = Experiment(small_plan(*overrides), run_dir=tmp_path / "n")
    plan = _server_plan(exp, 0)
    assert [s["op"] for s in plan] == ops
    node.stack.check_client_plan(plan, round_idx=0)
    with pytest.raises(PermissionError, match="where this run's layers ask for"):
        node.stack.check_client_plan([*plan, {"op": "dp.clip", "clip_norm": 9.0}], round_idx=0)


def test_bounds_are_a_finite_range_and_types_must_match():
    expected = [{"op": "x", "std": Bounds(1.0, 4.0), "n": 3, "w": "uniform"}]
    assert plan_mismatch([{"op": "x", "std": 1.0, "n": 3, "w": "uniform"}], expected) is None
    assert plan_mismatch([{"op": "x", "std": 4, "n": 3, "w": "uniform"}], expected) is None
    bads = ({"std": 0.5}, {"std": 4.5}, {"std": True}, {"std": "2"}, {"std": float("nan")}, {"std": float("inf")},
            {"n": 3.0}, {"n": True}, {"w": "x"})  # fmt: skip
    for bad in bads:
        assert plan_mismatch([{"op": "x", "std": 1.0, "n": 3, "w": "uniform", **bad}], expected) is not None, bad


def test_the_server_refuses_to_send_a_plan_its_nodes_would_refuse(tmp_path, monkeypatch):
    """A layer whose session builds its client steps another way than its ``client_plan_steps`` (a plugin bug) would
    have every client refuse every round: the server checks its own plan first and stops with one clear error."""
    from protocols.dp.layer import DifferentialPrivacy

    exp = Experiment(small_plan("protocols=[dp]", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5}"),
                     run_dir=tmp_path)  # fmt: skip
    honest = DifferentialPrivacy.client_plan_steps

    def server_side_differs(self, inner, *, round_idx, min_summands=None, on_node=False):
        steps = honest(self, inner, round_idx=round_idx, min_summands=min_summands, on_node=on_node)
        return steps if on_node else [{**steps[0], "clip_norm": 1.0}, *steps[1:]]

    monkeypatch.setattr(DifferentialPrivacy, "client_plan_steps", server_side_differs)
    monkeypatch.setattr(exp.executor, "remote", True, raising=False)  # plans are built for remote clients only
    with pytest.raises(RuntimeError, match="own client plan would be refused by its nodes .*clip_norm=1.0"):
        exp.train_round()
