"""Real faults on Flower: each message stage a round survives losing has a deadline (``flower.stage_timeout_s``); a
node that misses it, or that the SuperLink says went offline, drops out of the rest of its round with all its
clients (its later messages of the round are not sent); a late reply is discarded; a restarted node (under a new
node id) takes its partition over at the next round's first message. The executor is tested against a scripted
grid, and on Flower's simulation engine with a node that sleeps past the deadline at each SecAgg+ stage."""

from __future__ import annotations

import json
import time
import uuid
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Message

from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from secure_fed.engine.flower.codec import encode
from secure_fed.engine.flower.executor import FlowerExecutor
from secure_fed.engine.flower.node_faults import check_exact_sums
from secure_fed.engine.flower.simulation import node_storage_dir, run_on_flower
from tests.conftest import small_config


# ---------------------------------------------------------------------------------------------------- a scripted grid
class ScriptedGrid:
    """A grid whose nodes answer as ``behaviour(node, content)`` says: ``"ok"``, ``"silent"`` (no reply: a dead node)
    or ``"error"`` (a client's error reply). Node ``n`` holds partition ``parts[n]``. ``stale`` replies are handed out
    with the next pull (a late answer to an earlier message)."""

    def __init__(self, parts: dict[int, int], num_partitions: int, behaviour):
        self.parts, self.num_partitions, self.behaviour = dict(parts), num_partitions, behaviour
        self.sent: list[tuple[int, dict]] = []  # (node, meta) of every message pushed
        self.pending: list[Message] = []
        self.stale: list[Message] = []
        self.kept: list[Message] = []  # every message pushed

    def get_node_ids(self):
        return list(self.parts)

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            m.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.sent.append((m.metadata.dst_node_id, dict(m.content["meta"])))
            self.kept.append(m)
            ids.append(m.metadata.message_id)
            what = self.behaviour(m.metadata.dst_node_id, m.content["meta"])
            if what == "ok":
                self.pending.append(self.answer(m))
            elif what == "error":
                from flwr.app import Error

                reply = Message(Error(code=0, reason="the client's own error"), reply_to=m)
                reply.metadata.__dict__["_src_node_id"] = m.metadata.dst_node_id
                self.pending.append(reply)
        return ids

    def answer(self, m: Message) -> Message:
        meta = m.content["meta"]
        content = encode({})
        extra = {}
        if meta["kind"] == "whoami":
            extra = {"partition_id": self.parts[m.metadata.dst_node_id], "num_partitions": self.num_partitions}
        content["meta"] = ConfigRecord({"seq": int(meta["seq"]), **extra})
        reply = Message(content, reply_to=m)
        reply.metadata.__dict__["_src_node_id"] = m.metadata.dst_node_id
        return reply

    def pull_messages(self, ids):
        ids = set(ids)
        out = [r for r in self.pending if r.metadata.reply_to_message_id in ids] + self.stale
        self.pending = [r for r in self.pending if r not in out]
        self.stale = []
        return out


@pytest.fixture
def server_identity(monkeypatch):
    """What a ServerApp process has: its run and node ids (Flower reads them when a message is built)."""
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def _executor(grid, *, rounds_ctx):
    ok = SimpleNamespace(check_down=lambda cid, payload: None, check_up=lambda cid, payload, **kw: None)
    ctx = SimpleNamespace(
        records=SimpleNamespace(flower_session=None), stack=SimpleNamespace(layers=[]), guard=ok, messages=None,
        algorithm=SimpleNamespace(keeps_client_state=False),
        plan=SimpleNamespace(flower=SimpleNamespace(on_client_failure="drop")),
    )  # fmt: skip
    rounds_ctx.append(ctx)
    ctx.round = 0
    return FlowerExecutor(grid, ctx, max_in_flight=64, timeout_s=30.0, stage_timeout_s=0.3)


def _stage_fn(payload, data):
    return {}


def _stage(ex, cids, stage="advertise"):
    from secure_fed.client_functions import client_function

    client_function(_stage_fn)
    return ex.query(cids, lambda c: {"secagg": stage}, _stage_fn, partial=True)


def test_a_lost_node_drops_out_of_its_round_with_all_its_clients_and_a_late_reply_is_discarded(server_identity):
    """3 nodes, 6 clients (client c on partition c mod 3). Round 0: node 11 (partition 1) never answers: client 1
    misses the deadline, and client 4 (the same node, a later batch: one message per node at once) is dropped
    without a message. An error reply (a client's own failure, the node alive) drops that client only. Round 1:
    node 11's partition is taken over by node 21 (a restarted SuperNode), which answers; the dead node's late reply
    from round 0, handed out in round 1's pull, is discarded."""
    dead: set[int] = set()
    error_cid = 5
    grid = ScriptedGrid({10: 0, 11: 1, 12: 2}, 3, lambda node, meta: "silent" if node in dead else (
        "error" if meta.get("cid") == error_cid and meta["kind"] == "query" else "ok"))  # fmt: skip
    ctxs: list = []
    ex = _executor(grid, rounds_ctx=ctxs)
    assert ex.ctx.stack  # a stack: one message per node in a batch, as with protocol layers
    ex.discover(6, 3)
    dead.add(11)  # node 11 dies after the set-up
    started = time.monotonic()
    answered = _stage(ex, list(range(6)))
    assert [c for c, _ in answered] == [0, 2, 3]
    assert time.monotonic() - started < 5.0  # one deadline of 0.3 s, not one per client
    to_dead = [meta["cid"] for node, meta in grid.sent if node == 11 and meta["kind"] == "query"]
    assert to_dead == [1]  # client 4's message was never sent to the dead node
    why = {(r, s, c): w for r, s, c, w in ex.dropouts}
    assert set(why) == {(0, "advertise", 1), (0, "advertise", 4), (0, "advertise", 5)}
    assert "within 0.3 s" in why[0, "advertise", 1] and "earlier in round 0" in why[0, "advertise", 4]
    assert "the client's own error" in why[0, "advertise", 5]
    assert ex.down.keys() == {1}  # the erring client's node stays up: its other client (2) answered

    # round 1: a restarted SuperNode (new id 21) holds partition 1; the dead node's reply comes late
    late = grid.answer(next(m for m in grid.kept if m.metadata.dst_node_id == 11 and m.content["meta"]["kind"] == "query"))
    grid.stale.append(late)
    grid.parts[21] = 1
    ex.ctx.round = 1
    answered = _stage(ex, [1, 4], stage="share")
    assert [c for c, _ in answered] == [1, 4]
    assert ex.late_discarded == 1
    assert [meta["cid"] for node, meta in grid.sent if node == 21 and meta["kind"] == "query"] == [1, 4]
    assert ex.node_of[1] == ex.node_of[4] == 21 and not ex.down


# ------------------------------------------------------------------------------------------- a slow node, on Flower
SLOW, OTHER = 1, 5  # clients 1 and 5 (of 8) sit on node 1 of 4; client 1 is asked first at each stage
BASE = [
    "algorithm.name=fedaws", "training.rounds=2", "evaluation.every=2", "flower.num_supernodes=4", "partition.num_clients=8",
    "protocols=[dp, secure_aggregation]", "privacy.client={noise_multiplier: 0.8, clip_norm: 0.5}",
    "secure_aggregation.threshold=0.6", "secure_aggregation.consistency_check=false", "flower.stage_timeout_s=12",
    "output.log_messages=true", "flower.debug_write_inputs=true",
]  # fmt: skip


def slow_app(cfg, stage: str, sleep_s: float, state_dir):
    """The project's ClientApp, except that the node of client SLOW sleeps ``sleep_s`` before it answers round 1's
    message of ``stage`` (``input``: the training message) for that client, then answers as usual (late)."""
    from flwr.clientapp import ClientApp

    from secure_fed.config import dump_config
    from secure_fed.engine.flower.client_app import REQUEST_META, make_client_app
    from secure_fed.engine.flower.codec import decode

    honest = make_client_app(dump_config(cfg), None, Experiment, state_dir=state_dir)
    app = ClientApp()

    @app.query()
    def query(msg, context):
        meta = msg.content["meta"]
        if "cid" in meta and int(meta["cid"]) == SLOW:
            payload = decode(msg.content, meta_keys=REQUEST_META)
            if payload.get("secagg") == stage and payload.get("secagg_round") == 1:
                time.sleep(sleep_s)
        return honest(msg, context)

    @app.train()
    def train(msg, context):
        meta = msg.content["meta"]
        if stage == "input" and int(meta["cid"]) == SLOW and int(meta["round"]) == 1:
            time.sleep(sleep_s)
        return honest(msg, context)

    return app


@pytest.mark.parametrize("stage", ["share", "input", "unmask"])  # advertise: the deployment test
def test_a_node_slower_than_the_stage_deadline_drops_out_at_that_stage(stage, tmp_path):
    """Client SLOW's node answers round 1's ``stage`` message 18 s late, past ``flower.stage_timeout_s`` = 12 s (a
    deadline that honest replies on a busy machine stay under; 4 s was missed once under a load average of 20): the
    node drops out at that stage with both its clients (OTHER, asked after SLOW, gets no message), the round
    completes (t = 5 of 8, no ConsistencyCheck, whose quorum ⌈(8 + 5)/2⌉ = 7 two dropouts after ShareKeys would
    miss: SecAgg+ recovers their masks, or, at ``unmask``, the survivors' shares suffice), the late reply enters
    nothing, and the unmasked sum is exactly the survivors' encoded inputs."""
    cfg = small_config(*BASE, "backend=flower")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    result = run_on_flower(exp, progress=False, client_app=slow_app(cfg, stage, 18.0, node_storage_dir(tmp_path / "run")))
    assert result.summary["status"] == "completed" and result.summary["rounds_aborted"] == 0
    drops = sorted((r, s, c) for r, s, c, _ in exp.executor.dropouts)
    assert drops == [(1, stage, SLOW), (1, stage, OTHER)]
    round1 = exp.diagnostics[1]
    assert round1["secagg_threshold"] == 5
    if stage == "unmask":  # their masked inputs are in the sum; they sent no unmasking shares
        assert round1["secagg_survivors"] == 8 and round1["secagg_dropped"] == 0
    else:
        assert round1["secagg_survivors"] == 6 and round1["secagg_dropped"] == 2
    ups = [m["client"] for m in exp.messages if m["direction"] == "up"]
    masked = [m["client"] for m in exp.messages if m["direction"] == "up" and "masked" in m["message"]]
    assert masked.count(OTHER) == masked.count(3) - (stage != "unmask")  # client 3: another node
    assert masked.count(SLOW) == masked.count(3) - (stage != "unmask")
    assert ups.count(OTHER) < ups.count(3)  # no late reply of round 1 entered the server's messages
    # each node noted its progress (what the fault driver reads): the last message of the run is round 2's Unmasking
    assert (node_storage_dir(tmp_path / "run") / "progress-0").read_text().split() == ["2", "unmask"]
    # each round's unmasked sum is exactly the survivors' encoded inputs, as the nodes wrote them, summed mod 2^bits
    sums = check_exact_sums(tmp_path / "run", [node_storage_dir(tmp_path / "run")])
    assert sums == {1: {"survivors": 8, "exact": True, "missing": []},
                    2: {"survivors": round1["secagg_survivors"], "exact": True, "missing": []}}  # fmt: skip


# ------------------------------------------------------------------------------------ a real deployment under faults
SCHEDULE = """nodes: 8
events:
  - {round: 1, stage: advertise, kill: [0]}
  - {round: 1, stage: input, kill: [5]}
  - {round: 2, stage: superlink}
  - {round: 3, stage: share, kill: [3]}
  - {round: 3, stage: unmask, kill: [6]}
"""
DEPLOYED = [
    "training.rounds=3", "evaluation.every=3", "output.progress=false", "dataset.synthetic.num_train=400",
    "dataset.synthetic.num_test=200", "dataset.synthetic.num_labels=8", "dataset.synthetic.num_groups=2",
    "dataset.synthetic.num_features=16", "dataset.synthetic.feature_noise=0.6", "model.embedding_dim=16",
    "model.hidden_dims=[32]", "device=cpu", "algorithm.name=fedaws", "partition.num_clients=8",
    "protocols=[dp,secure_aggregation]", "privacy.client.noise_multiplier=0.8", "privacy.client.clip_norm=0.5",
    "privacy.noise_seed=5", "secure_aggregation.graph_seed=3", "secure_aggregation.threshold=0.51",
    "secure_aggregation.consistency_check=false", "flower.stage_timeout_s=150",
]  # fmt: skip


def test_eight_authenticated_supernodes_killed_at_every_stage_and_a_superlink_kill(tmp_path):
    """8 authenticated TLS SuperNodes (one client each), 3 rounds of [dp, secure_aggregation]: node 0 dies at round
    1's AdvertiseKeys and node 5 at its masked input, the SuperLink dies after round 2's start (the run resumes from
    its checkpoint), node 3 dies at round 3's ShareKeys and node 6 at its Unmasking; each node kills itself on the
    stage's message and the driver restarts it. Every round completes with its survivors' sum exact (the nodes'
    own inputs against the server's unmasked sum), the final model equals the in-process replay of the same schedule
    within 1e-5, the privacy ledger equals the uninterrupted replay's (ε not spent twice), and none of the nodes'
    secrets is in any file of the SuperLink's side."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "experiments"))
    import deploy_faults as df

    schedule = tmp_path / "schedule.yaml"
    schedule.write_text(SCHEDULE)
    out = tmp_path / "faults"
    rc = df.main(["--nodes", "8", "--schedule", str(schedule), "--out", str(out), "--timeout", "1500",
                  *[a for o in DEPLOYED for a in ("--set", o)]])  # fmt: skip
    report = json.loads((out / "faults-report.json").read_text())
    assert rc == 0, report["driver"]
    events = [e["event"] for e in report["driver"]["events"]]
    assert events.count("node died") == 4 and events.count("node restarted") == 4, report["driver"]
    assert events.count("superlink killed") == 1 and events.count("superlink restarted") == 1
    c = report["checks"]
    assert c["status"] == "completed" and c["rounds_completed"] == 3 and c["rounds_aborted"] == 0, c
    assert c["replay_status"] == "completed" and c["replay_rounds_aborted"] == 0
    assert c["rounds_summed"] == 3 and c["sums_exact"], c["sums"]
    assert c["sums"]["1"]["survivors"] == 6 and c["sums"]["2"]["survivors"] == 8 and c["sums"]["3"]["survivors"] == 7
    assert c["model_within_atol"], c["model_max_abs_diff"]
    assert c["privacy_equal"], (c["privacy"], c["replay_privacy"])
    assert c["node_secrets_looked_for"] > 0 and c["node_secrets_in_superlink_files"] == []
    pss = report["node_pss_mib"]  # sampled by its thread while the run went on (one sample is taken at the start)
    assert pss["samples"] >= 2 and 0 < pss["peak_mean_mib"] <= pss["peak_max_mib"] < 4096, pss
    oom = next(e for e in report["driver"]["events"] if e["event"] == "flwr run ended")["oom_kills"]
    assert isinstance(oom, list) or oom.startswith("kernel log not read"), oom  # the field is there, well-formed


def test_the_sum_checker_reads_the_nodes_inputs_and_finds_a_wrong_word(tmp_path):
    """check_exact_sums: the survivors' words summed mod 2^bits against the server's sum; a survivor whose input no
    node holds, or one word off, is not exact; a non-survivor's input is not summed."""
    import numpy as np

    from secure_fed.engine.flower.node_faults import sum_writer, write_input

    rng = np.random.default_rng(0)
    bits = 20
    inputs = {c: rng.integers(0, 1 << bits, size=50, dtype=np.uint32) for c in range(4)}
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for c, x in inputs.items():
        write_input(nodes[c % 2], 0, c, x)
    total = (sum(inputs[c].astype(np.uint64) for c in (0, 1, 3)) % (1 << bits)).astype(np.uint32)  # 2 dropped out
    write = sum_writer(tmp_path / "run")
    write(0, [0, 1, 3], total, bits)
    assert check_exact_sums(tmp_path / "run", nodes) == {1: {"survivors": 3, "exact": True, "missing": []}}
    write(0, [0, 1, 2, 3], total, bits)  # the server claims client 2's input is in the sum
    assert check_exact_sums(tmp_path / "run", nodes)[1]["exact"] is False
    bad = total.copy()
    bad[7] = (int(bad[7]) + 1) % (1 << bits)
    write(0, [0, 1, 3], bad, bits)
    assert check_exact_sums(tmp_path / "run", nodes)[1]["exact"] is False
    write(0, [0, 1, 3, 9], total, bits)
    assert check_exact_sums(tmp_path / "run", nodes)[1] == {"survivors": 4, "exact": False, "missing": [9]}
