"""The DP layer on Flower: the clients clip as the round's plan says (a registered step run by the node), the
server noises, samples and accounts as in process, and an update that arrives unclipped is refused."""

from __future__ import annotations

import json

import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from flwr.clientapp import ClientApp

from secure_fed.config import build_plan, dump_config
from secure_fed.engine import Experiment
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.flower.client_app import make_client_app
from secure_fed.engine.flower.simulation import run_on_flower
from secure_fed.errors import PrivacyViolation
from tests.conftest import small_config, small_plan
from tests.engine.flower.nodes import assert_same_run, run_in_process, run_recorded, server_side_bytes

# FedALC (the default) with both units: client-level DP (clip on the node, server noise, secret Poisson sampling)
# and instance-level DP-SGD on the server's W step over the label sets the nodes send; a fixed noise seed makes
# the server's secret draws the same in both runs
DP = ["protocols=[dp]", "algorithm.normalize_gamma=false", "privacy.noise_seed=7", "training.rounds=3",
      "evaluation.every=3", "training.client_fraction=0.5", "training.sampling=poisson", "flower.num_supernodes=4",
      "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5}",
      "privacy.instance={noise_multiplier: 1.0, clip_norm: 1.0, sample_rate: 0.5}"]  # fmt: skip


# DP-SGD in client training (privacy.local): each client's Poisson batches and noise come from its own secret
# stream, which lives in its node's context.state; FedAwS (no label sets), a fixed noise seed so that the in-process
# run's clients draw the same
LOCAL = ["protocols=[dp]", "algorithm.name=fedaws", "training.rounds=2", "evaluation.every=2",
         "flower.num_supernodes=4",
             "privacy.local={noise_multiplier: 1.0, clip_norm: 1.0, batch_sample_rate: 0.5, "
             "max_labels_per_instance: 8}"]  # fmt: skip
# the clip split over an instance's copies: each node clips its own clients' copies to C/√k from the copy counts
# its own rows carry (ClientData.copies), as the in-process clients do
LOCAL_SPLIT = [*LOCAL[:-1], "privacy.local={noise_multiplier: 1.0, clip_norm: 1.0, batch_sample_rate: 1.0, "
               "max_labels_per_instance: 8, copy_clip: split}"]  # fmt: skip
# distributed noise (noise: clients): each client adds its share from its own stream, inside the secure sum
SHARES = ["protocols=[dp, secure_aggregation]", "algorithm.name=fedaws", "training.rounds=2", "evaluation.every=2",
          "flower.num_supernodes=4", "output.log_messages=true",
          "privacy.client={noise_multiplier: 1.0, clip_norm: 0.5, noise: clients}"]  # fmt: skip


def test_dp_on_flower_equals_in_process(tmp_path):
    local_exp, local = run_in_process(DP, tmp_path / "local")
    flower_exp = Experiment(small_plan(*DP, "backend=flower"), run_dir=tmp_path / "flower")
    flower = flower_exp.run(progress=False)
    assert flower_exp.executor.name == "flower" and flower_exp.executor.sent["train"] > 0
    assert flower.summary["privacy"] == local.summary["privacy"]
    units = flower.summary["privacy"]["units"]
    assert units["client"]["steps"] == 3 and units["instance"]["steps"] == 3
    assert_same_run(flower_exp, flower, local_exp, local)


def _run_with_nodes(cfg, tmp_path, train):
    """Run ``cfg`` on Flower with every node's training messages going through ``train(honest, msg, context)``,
    where ``honest`` is the project's ClientApp (a test plays a server's altered message, or a node's altered code,
    around it); setup queries reach the honest app unchanged. Returns (experiment, result)."""
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    honest = make_client_app(dump_config(cfg), None, Experiment)
    app = ClientApp()

    @app.query()
    def query(msg, context):
        return honest(msg, context)

    @app.train()
    def train_(msg, context):
        return train(honest, msg, context)

    return exp, run_on_flower(exp, progress=False, client_app=app)


def _refused(call, why: str) -> None:
    """Inside a node: ``call()`` must raise the node's PermissionError saying ``why``."""
    try:
        call()
    except PermissionError as e:
        assert why in str(e), e
    else:
        raise AssertionError(f"the node did not refuse ({why})")


def test_a_node_refuses_a_weaker_clip_and_a_node_that_skips_the_clip_is_refused_by_the_server(tmp_path):
    """The server chooses the round's plan: one that asks for a clip norm larger than the run's config gives is
    refused by the honest node (it checks the plan against its own copy of the config; the client then drops out,
    or with ``on_client_failure: stop`` the run stops with the node's reason). A node whose code drops the plan (so
    it never clips) is refused by the server: its DP session refuses the first update above the clip norm, and the
    run stops with that error."""
    # a clip far below any update's norm: every unclipped update is over it
    cfg = small_config(*DP, "backend=flower", "training.rounds=1", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.001}")

    def weakened_then_skipping(honest, msg, context):
        from secure_fed.engine.layers import ProtocolStack

        meta = dict(msg.content["meta"])
        assert json.loads(meta.pop("plan")) == [{"op": "dp.clip", "clip_norm": 0.001}]  # what the server asked for
        msg.content["meta"] = ConfigRecord({**meta, "plan": json.dumps([{"op": "dp.clip", "clip_norm": 50.0}])})
        _refused(lambda: honest(msg, context), "plan for round 0 gives step 'dp.clip' clip_norm=50.0, where this run's")
        msg.content["meta"] = ConfigRecord(meta)  # no plan at all, and this node's code does not check its plan
        check = ProtocolStack.check_client_plan
        ProtocolStack.check_client_plan = lambda self, plan, **kw: None
        try:
            return honest(msg, context)
        finally:
            ProtocolStack.check_client_plan = check

    with pytest.raises(PrivacyViolation, match="was not clipped"):
        _run_with_nodes(cfg, tmp_path, weakened_then_skipping)


def test_a_node_refuses_to_train_a_round_again_on_another_model_plan_or_mask(tmp_path):
    """A client's DP randomness is addressed by the round (here its noise share inside secure aggregation): round r
    again on another model, or on the same model under a plan with a larger share (the same draws, scaled), would
    release the same noise twice, so the round's digest refuses both; the very same message again is refused by the
    round's masks, which hide one input only (two inputs masked alike give their difference). That a resumed run's
    replay of a round is taken: ``test_resume_on_flower.py``."""
    from secure_fed.engine.flower.client_app import REQUEST_META
    from secure_fed.engine.flower.codec import decode, encode

    def replaying(honest, msg, context):
        original = msg.content
        reply = honest(msg, context)
        payload = decode(original, meta_keys=REQUEST_META)
        name = sorted(payload["theta"])[0]
        payload["theta"][name] = payload["theta"][name] + 1e-3  # another model for the same round
        other = encode(payload)
        other["meta"] = original["meta"]
        meta = dict(original["meta"])
        plan = json.loads(meta["plan"])
        larger = [dict(s) for s in plan]
        larger[1]["std"] = plan[1]["std"] * 1.5  # within [σS/√t, σS]: the plan check alone would take it
        with_larger = RecordDict({**dict(original.items()), "meta": ConfigRecord({**meta, "plan": json.dumps(larger)})})
        for content, why in ((other, "arrived again with another payload or plan"),
                             (with_larger, "arrived again with another payload or plan"),
                             (original, "second masked input")):  # fmt: skip
            msg.content = content
            _refused(lambda: honest(msg, context), why)
        return reply

    cfg = small_config(*SHARES, "backend=flower", "training.rounds=1", "flower.on_client_failure=stop")
    exp, result = _run_with_nodes(cfg, tmp_path, replaying)
    assert result.summary["status"] == "completed" and exp.executor.sent["train"] > 0


def test_the_dp_session_refuses_an_unclipped_plaintext_update(tmp_path):
    """In process too: the DP session's submit checks the norm of every plaintext update against S."""
    from protocols.dp.client_dp import update_norm
    from protocols.dp.layer import DifferentialPrivacy

    e = Experiment(small_plan(*DP), run_dir=tmp_path)
    dp = next(layer for layer in e.stack.layers if isinstance(layer, DifferentialPrivacy))
    session = dp.open_round(0, RoundSession(cohort=[0], theta=e.theta, W=e.W, weighting="uniform"))
    big = {"theta_delta": {n: torch.full_like(t, 0.1) for n, t in e.theta.items()}, "num_examples": 1, "loss": 0.0}
    assert update_norm(big) > 0.5 * 1.001
    with pytest.raises(PrivacyViolation, match="above privacy.client.clip_norm 0.5"):
        session.submit(0, big)
    scale = 0.5 / update_norm(big)
    at_s = {**big, "theta_delta": {n: t * scale for n, t in big["theta_delta"].items()}}
    nan = {**big, "theta_delta": {n: torch.full_like(t, float("nan")) for n, t in big["theta_delta"].items()}}
    with pytest.raises(PrivacyViolation, match="not clipped"):
        session.submit(0, nan)
    with pytest.raises(PrivacyViolation, match="carries weight 3.0"):  # clipped, but it would count three times
        session.submit(0, {**at_s, "weight": 3.0})
    session.submit(0, {**at_s, "weight": 1.0})  # at S, weight 1: taken
    session.submit(0, at_s)


@pytest.mark.parametrize("overrides", [LOCAL, LOCAL_SPLIT, SHARES], ids=["privacy.local", "copy-clip-split", "noise-clients"])
def test_client_secret_streams_on_flower(overrides, tmp_path):
    """The node draws exactly what the in-process client draws (same stream, same labels): DP-SGD's batches and
    noise, or the noise share (the plan's ``layer:dp.noise_share_step``); a node that skipped its draw (or drew from
    another stream) would leave θ different from the in-process run's. The streams' keys live on the nodes: each
    node holds only its own clients' (the recording app checks), the server's layer drew none, and no key appears
    in anything the server holds (messages, layer state, checkpoints, any file of its run directory). A fixed
    noise seed makes the in-process clients derive the same keys; without one each node draws them from
    os.urandom (the same code path from there on)."""
    seeded = [*overrides, "privacy.noise_seed=3", "output.log_messages=true"]
    flower_exp, flower, nodes = run_recorded(seeded, tmp_path)
    local_exp, local = run_in_process(seeded, tmp_path / "local")
    assert flower.summary["privacy"] == local.summary["privacy"]
    assert flower.summary["privacy"]["epsilon"] < float("inf")
    assert_same_run(flower_exp, flower, local_exp, local)
    # the message log keeps each round's plan beside the payload it went with (public values only)
    # (DP-SGD in client training needs no plan: the node's own layer turns its training into DP-SGD)
    plans = [m["plan"] for m in flower_exp.messages if m["direction"] == "down" and "plan" in m]
    if overrides is SHARES:
        assert len(plans) == flower_exp.executor.sent["train"] > 0
    else:
        assert plans == []
    assert all([s["op"] for s in p] == ["dp.clip", "layer:dp.noise_share_step", "layer:secure_aggregation.mask_step"]
               for p in plans)  # fmt: skip

    keys = [bytes.fromhex(json.loads(p.read_text())[0]) for p in nodes.glob("dp-stream-*.json")]
    cids = {int(p.stem.rsplit("-", 1)[1]) for p in nodes.glob("dp-stream-*.json")}
    assert cids and cids <= set(range(len(flower_exp.fed.clients)))
    assert len(set(keys)) == len(keys) == len(cids)  # one key per client that trained
    assert not [k for k in keys if k in server_side_bytes(flower_exp)]
    assert flower_exp.stack.by_name()["dp"]._client_streams == {}  # the server's layer drew no client key
