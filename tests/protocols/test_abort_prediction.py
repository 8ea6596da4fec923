"""The abort predictor (protocols.secagg.abort_prediction) against the protocol itself: on seeded node-level drop
patterns at several rates, and on adversarial ones at each threshold's edge, the predicted outcome (complete or
abort, the stage, the summed set) is the protocol's every time; and the layer's rounds under a fault schedule."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from protocols.secagg.abort_prediction import abort_stage, predict_round
from protocols.secagg.fault_schedule import STAGES
from protocols.secagg.protocol import SecAggAbort, neighbour_graph, secure_sum, threshold_for
from tests.conftest import small_plan

SUM_STAGES = (*STAGES[:3], "consistency", "unmask")  # secure_sum's stages: the layer's, and the consistency round


def _actual(inputs, t, k, seed, drops, cc):
    """(completes, stage or None, U3, sum) from running the protocol."""
    try:
        total, u3, _ = secure_sum(inputs, threshold=t, neighbors=k, graph_seed=seed, drop=drops, consistency_check=cc)
    except SecAggAbort as e:
        return False, abort_stage(str(e)), frozenset(), None
    return True, None, frozenset(u3), total


def _check(n, k, t, seed, drops, cc):
    inputs = {u: np.array([u + 1, 7 * u + 3], dtype=np.uint64) for u in range(n)}
    graph = neighbour_graph(list(range(n)), k, seed)
    pred = predict_round(graph, t, drops, consistency_check=cc)
    done, stage, u3, total = _actual(inputs, t, k, seed, drops, cc)
    assert (pred.completes, pred.stage) == (done, stage), (n, k, t, seed, drops, cc, pred.reason)
    if done:  # a completed round sums exactly the predicted survivors' inputs
        assert pred.summed == u3
        assert np.array_equal(total, sum((inputs[u] for u in sorted(u3)), np.zeros(2, dtype=np.uint64)))
    return pred


def _node_drops(rng, n, nodes, p, stages):
    """Each node fails with probability p at a uniformly drawn stage; its clients (c mod nodes) drop together."""
    out = {s: set() for s in stages}
    for v in range(nodes):
        if rng.random() < p:
            s = stages[rng.integers(len(stages))]
            for c in range(v, n, nodes):
                out[s].add(c)
    # cumulative, as a fault schedule gives them: from the kill stage on
    return {s: set().union(*(out[x] for x in stages[: i + 1])) for i, s in enumerate(stages)}


@pytest.mark.parametrize("p", [0.05, 0.15, 0.3])
def test_the_prediction_matches_the_protocol_on_seeded_node_level_drops(p):
    rng = np.random.default_rng([56, int(p * 100)])
    outcomes = {True: 0, False: 0}
    for i in range(70):
        n = int(rng.integers(6, 15))
        nodes = int(rng.integers(2, 9))
        k = [None, 2, 4, 6][i % 4]
        k = None if k is not None and k >= n - 1 else k
        group = n if k is None else k + 1
        t = threshold_for(group, [0.51, 0.6, 0.75][i % 3])
        cc = i % 5 != 0
        stages = SUM_STAGES if cc and i % 7 == 0 else STAGES
        pred = _check(n, k, t, i, _node_drops(rng, n, nodes, p, stages), cc)
        outcomes[pred.completes] += 1
    assert outcomes[True] and outcomes[False], outcomes  # both outcomes were exercised


def _edge_cases():
    """Drop patterns at and one past each check's edge (the threshold, the quorum, the shares' count)."""
    cases = []
    for n, k, tau in [(9, None, 0.6), (12, None, 0.75), (12, 4, 0.6), (14, 6, 0.6)]:
        group = n if k is None else k + 1
        t = threshold_for(group, tau)
        slack = group - t  # a neighbourhood survives losing this many
        for cc in (True, False):
            for stage in ("advertise", "share", "input", "unmask"):
                # without the quorum a group loses up to `slack`; with it, drops after ShareKeys count twice
                edge = slack // 2 if cc and stage in ("share", "input") else slack
                for extra in (0, 1):
                    graph = neighbour_graph(list(range(n)), k, 5)
                    centre = 3
                    victims = sorted(graph[centre])[: edge + extra]  # all inside one client's neighbourhood
                    if len(victims) < edge + extra:
                        continue
                    drops = {s: set() for s in STAGES}
                    for s in STAGES[STAGES.index(stage) :]:
                        drops[s] = set(victims)
                    cases.append((n, k, t, 5, drops, cc, extra))
    return cases


@pytest.mark.parametrize("case", _edge_cases(), ids=lambda c: f"n{c[0]}-k{c[1]}-t{c[2]}-cc{int(c[5])}-{c[6]}")
def test_the_prediction_matches_the_protocol_at_each_thresholds_edge(case):
    n, k, t, seed, drops, cc, extra = case
    _check(n, k, t, seed, drops, cc)


def test_the_edge_cases_hit_both_sides():
    """At the edge the round completes; one more drop in the same neighbourhood aborts it (so an off-by-one in any
    check the cases reach changes a prediction)."""
    results = {}
    for n, k, t, seed, drops, cc, extra in _edge_cases():
        graph = neighbour_graph(list(range(n)), k, seed)
        results.setdefault(extra, []).append(predict_round(graph, t, drops, consistency_check=cc).completes)
    assert all(results[0]) and not any(results[1])


def test_the_checks_that_other_checks_mostly_cover_are_replayed_too():
    """Everyone gone at a stage (the count check: no neighbourhood is left to check), and a client that sent its input
    but not its unmasking shares whose neighbourhood keeps too few of its self-mask shares while every answering
    client's neighbourhood is whole enough (k = 2, t = 2: it and one neighbour leave at unmask)."""
    for stage in ("advertise", "share", "input", "unmask"):
        drops = {s: set(range(8)) for s in STAGES[STAGES.index(stage) :]}
        for cc, t in ((True, 5), (False, 5), (False, 1)):  # t = 1: only the count check sees an empty set
            assert not _check(8, None, t, 0, drops, cc).completes
    graph = neighbour_graph(list(range(8)), 2, 11)
    centre = 4
    drops = {"unmask": {centre, graph[centre][0]}}
    for cc in (True, False):
        pred = _check(8, 2, 2, 11, drops, cc)
        assert pred.stage == "Unmasking" and "self-mask" in pred.reason, pred


def test_a_cohort_of_one_aborts_and_an_undropped_round_completes():
    assert predict_round({4: []}, 1, {}).stage == "cohort"
    graph = neighbour_graph(list(range(6)), None, 0)
    assert predict_round(graph, 4, {}).completes and predict_round(graph, 4, {}).summed == frozenset(range(6))


# ---------------------------------------------------------------- the layer's rounds under a fault schedule


def test_the_layer_aborts_exactly_the_rounds_predicted_under_a_schedule(tmp_path):
    """small_config: 8 clients on 4 nodes (2 each), the complete graph, t = 5, the consistency check: kills at each
    stage; every round's outcome and summed count as predicted from the schedule, the graph and t."""
    from protocols.secagg.fault_schedule import load_fault_schedule
    from secure_fed.engine import Experiment

    events = [
        {"round": 1, "stage": "advertise", "kill": [0]},  # 6 left ≥ t: completes
        {"round": 2, "stage": "share", "kill": [1]},  # quorum: 0 + 2·2 = 4 > 8 − 5 = 3: aborts
        {"round": 3, "stage": "input", "kill": [2]},  # the same count at input: aborts
        {"round": 4, "stage": "unmask", "kill": [3]},  # 6 answer, ≥ t: completes
        {"round": 5, "stage": "advertise", "kill": [0, 1]},  # 4 left < t: aborts at AdvertiseKeys
    ]
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"nodes": 4, "events": events}))
    exp = Experiment(small_plan("protocols=[secure_aggregation]", "training.rounds=6", "secure_aggregation.graph_seed=3",
                                f"secure_aggregation.fault_schedule={f}"), run_dir=tmp_path / "run")  # fmt: skip
    result = exp.run(progress=False)
    layer = exp.stack.by_name()["secure_aggregation"]
    schedule = load_fault_schedule(f)
    diags = [json.loads(x) for x in (tmp_path / "run" / "private" / "diagnostics.jsonl").read_text().splitlines()]
    assert len(diags) == 6
    cohort = list(range(len(exp.fed.clients)))
    expected = []
    for r, diag in enumerate(diags):
        graph = neighbour_graph(cohort, None, layer.graph_seed(r))
        t = threshold_for(len(cohort), layer.settings.section.threshold)
        pred = predict_round(graph, t, schedule.drops(r, cohort))
        expected.append(pred.completes)
        assert ("aborted" not in diag) == pred.completes, (r, diag.get("aborted"), pred.reason)
        if pred.completes:
            assert diag["secagg_survivors"] == len(pred.summed) == diag["clients"]
        else:
            assert abort_stage(diag["aborted"]) == pred.stage
    assert expected == [True, False, False, True, False, True]
    assert result.summary["rounds_aborted"] == 3
