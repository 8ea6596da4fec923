"""A client that disappears in a round on Flower: its node fails while training (here: the ClientApp raises for
one client in round 1). The round goes on as the stack requires: without a secure sum the server sums the others;
secure aggregation recovers the dropped client's masks from the survivors' shares; CKKS, whose sum (and the noise
shares calibrated on it) needs every cohort client, aborts the round, and the summary counts it. With
``flower.on_client_failure: stop`` the run stops with the node's error instead."""

from __future__ import annotations

import pytest

from secure_fed.config import build_plan, dump_config
from secure_fed.engine import Experiment
from secure_fed.engine.flower.client_app import make_client_app
from secure_fed.engine.flower.executor import FlowerError
from secure_fed.engine.flower.simulation import run_on_flower
from tests.conftest import small_config

LOST = 5  # the client whose node fails in round 1
BASE = ["algorithm.name=fedaws", "training.rounds=2", "evaluation.every=2", "flower.num_supernodes=4",
        "output.log_messages=true"]  # fmt: skip
STACKS = {
    "plain": [],
    "secure_aggregation": ["protocols=[dp, secure_aggregation]", "privacy.client={noise_multiplier: 0.8, clip_norm: 0.5}"],
    "ckks": ["protocols=[ckks]", "ckks.key_holders=2"],
}


def failing_app(cfg, *, stage: str | None = None):
    """The project's ClientApp, except that client LOST's node fails when it trains in round 1 (or, with ``stage``,
    when it is asked for that secure-aggregation stage in round 1)."""
    from flwr.clientapp import ClientApp

    from secure_fed.engine.flower.client_app import REQUEST_META
    from secure_fed.engine.flower.codec import decode

    honest = make_client_app(dump_config(cfg), None, Experiment)
    app = ClientApp()

    @app.query()
    def query(msg, context):
        meta = msg.content["meta"]
        if stage is not None and "cid" in meta and int(meta["cid"]) == LOST:
            payload = decode(msg.content, meta_keys=REQUEST_META)
            if payload.get("secagg") == stage and payload.get("secagg_round") == 1:
                raise ConnectionError("the device went offline")
        return honest(msg, context)

    @app.train()
    def train(msg, context):
        meta = msg.content["meta"]
        if stage is None and int(meta["cid"]) == LOST and int(meta["round"]) == 1:
            raise ConnectionError("the device went offline")
        return honest(msg, context)

    return app


def _run(overrides, tmp_path, *, stage: str | None = None):
    cfg = small_config(*BASE, *overrides, "backend=flower")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    return exp, run_on_flower(exp, progress=False, client_app=failing_app(cfg, stage=stage))


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_a_client_that_disappears_mid_round(stack, tmp_path):
    exp, result = _run(STACKS[stack], tmp_path)
    assert exp.executor.dropped == 1
    round1 = exp.diagnostics[1]
    updates = ("masked", "theta_delta", "ciphertexts")  # what a training reply carries under each stack
    ups = [m["client"] for m in exp.messages if m["direction"] == "up" and set(updates) & set(m["message"])]
    assert ups.count(LOST) == ups.count(LOST - 1) - 1  # one update fewer from it than from a client on another node
    if stack == "ckks":  # the sum needs the whole cohort: the round is aborted, counted, and the run goes on
        assert "aborted" in round1 and f"client {LOST} dropped out" in round1["aborted"]
        assert result.summary["rounds_aborted"] == 1 and result.summary["status"] == "completed_with_aborts"
        return
    assert result.summary["status"] == "completed" and result.summary["rounds_aborted"] == 0
    assert round1["clients_dropped"] == 1
    assert round1["clients"] == len(exp.fed.clients) - 1  # the others' updates are in the sum
    assert all("clients_dropped" not in d for r, d in enumerate(exp.diagnostics) if r != 1)
    if stack == "secure_aggregation":
        assert round1["secagg_dropped"] == 1 and round1["secagg_survivors"] == len(exp.fed.clients) - 1


def test_on_client_failure_stop_stops_the_run(tmp_path):
    with pytest.raises(FlowerError, match="the device went offline"):
        _run(["flower.on_client_failure=stop"], tmp_path)


@pytest.mark.parametrize("stage", ["share"])
def test_a_client_lost_in_a_secure_aggregation_stage_drops_out(stage, tmp_path):
    """A node that fails while its client advertises keys or shares them: the stage goes on with the clients that
    answered, the lost client neither trains nor is in the sum, and the round completes as SecAgg allows."""
    exp, result = _run(STACKS["secure_aggregation"], tmp_path, stage=stage)
    assert result.summary["status"] == "completed" and result.summary["rounds_aborted"] == 0
    assert exp.executor.stage_dropped == 1 and exp.executor.dropped == 0
    round1 = exp.diagnostics[1]
    assert round1["secagg_dropped"] == 1 and round1["clients"] == len(exp.fed.clients) - 1
    trained = [m["client"] for m in exp.messages if m["direction"] == "up" and "masked" in m["message"]]
    assert trained.count(LOST) == trained.count(LOST - 1) - 1  # it sent no masked input in round 1
