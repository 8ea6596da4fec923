"""Test instruments for the Flower back end: a ClientApp that also writes what each node holds (its clients'
keyrings, secure-aggregation round secrets and DP secret streams, read from the node's ``context.state``) to files, and a pin for
the in-process dealer's run key, so that an in-process run can repeat a Flower run exactly."""

from __future__ import annotations

import contextlib
import json
import os

from flwr.app import RecordDict
from flwr.clientapp import ClientApp

from secure_fed.config import build_plan, dump_config
from secure_fed.engine import Experiment
from secure_fed.engine.flower.client_app import STATE_RECORDS, make_client_app
from secure_fed.engine.flower.codec import decode
from tests.conftest import small_plan


def recording_app(cfg, out_dir) -> ClientApp:
    """The project's ClientApp, plus: after each message, the node writes its clients' keyrings (read from its
    context.state) to ``out_dir``, and CKKS key holders' keys — the test's only window into what the nodes hold."""
    honest = make_client_app(dump_config(cfg), None, Experiment)
    app = ClientApp()

    def dump(context) -> None:
        if STATE_RECORDS[1] not in context.state.keys():
            return
        state = decode(RecordDict({"arrays": context.state[STATE_RECORDS[0]], "values": context.state[STATE_RECORDS[1]]}))
        # a node's state holds its own clients only (c mod N = its partition), never another node's secrets
        p, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        held = [*state.get("keyed_hashing", {}), *state.get("secure_aggregation", {}),
                *state.get("ckks", {}).get("holders", {}), *state.get("dp", {})]  # fmt: skip
        foreign = [cid for cid in held if cid % n != p]
        if foreign:
            raise AssertionError(f"node {p} of {n} holds the state of clients {foreign}")
        for cid, ring in state.get("keyed_hashing", {}).items():
            (out_dir / f"{cid}.json").write_text(json.dumps({k: v.hex() if v else None for k, v in ring.items()}))
        for cid, entry in state.get("secure_aggregation", {}).items():  # its signing key; this round's secrets
            if entry.get("sign_sk"):
                (out_dir / f"secagg-sign-c{cid}.json").write_text(json.dumps([entry["sign_sk"].hex()]))
            if (client := entry.get("round")) is not None:
                secrets = [client[k].hex() for k in ("c_sk", "s_sk", "b_seed")]
                (out_dir / f"secagg-r{client['round_idx']}-c{cid}.json").write_text(json.dumps(secrets))
        for cid, stream in state.get("dp", {}).items():  # the client's own DP secret (DP-SGD, its noise share)
            (out_dir / f"dp-stream-{cid}.json").write_text(json.dumps([stream["key"].hex()]))
        for cid, holder in state.get("ckks", {}).get("holders", {}).items():  # key pair, secret, decryption noise key
            secrets = [holder["sk"].hex(), holder["secret"].hex() if holder.get("secret") else None, holder["noise"].hex()]
            (out_dir / f"ckks-holder-{cid}.json").write_text(json.dumps(secrets))

    @app.query()
    def query(msg, context):
        reply = honest(msg, context)
        dump(context)
        return reply

    @app.train()
    def train(msg, context):
        reply = honest(msg, context)
        dump(context)
        return reply

    return app


@contextlib.contextmanager
def pinned_run_key(run_key: bytes, salt: bytes):
    """The in-process dealer draws these (os.urandom(32), then os.urandom(16)) instead of fresh ones."""
    import protocols.keyed_hashing as kh

    draws = iter([run_key, salt])

    class _OS:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def urandom(n: int) -> bytes:
            value = next(draws)
            assert len(value) == n
            return value

    kh.os = _OS()
    try:
        yield
    finally:
        kh.os = os


def run_in_process(overrides: list[str], run_dir, *, run_key: tuple[bytes, bytes] | None = None):
    """The small-config run of ``overrides`` in process at one torch thread (as each Flower node trains), its dealer
    pinned to ``run_key`` = (run key, salt) when given; returns (experiment, result)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with pinned_run_key(*run_key) if run_key else contextlib.nullcontext():
            exp = Experiment(small_plan(*overrides), run_dir=run_dir)
            return exp, exp.run(progress=False)
    finally:
        torch.set_num_threads(threads)


def assert_same_run(flower_exp, flower_result, local_exp, local_result, *, atol: float = 1e-5, metric_atol: float = 1e-5):
    """θ and W within ``atol``, every final metric within ``metric_atol``."""
    import pytest
    import torch

    for n, t in local_exp.theta.items():
        assert torch.allclose(flower_exp.theta[n], t, atol=atol, rtol=0), n
    assert torch.allclose(flower_exp.W, local_exp.W, atol=atol, rtol=0)
    assert set(flower_result.summary["final"]) == set(local_result.summary["final"])
    for k, v in local_result.summary["final"].items():
        assert flower_result.summary["final"][k] == pytest.approx(v, abs=metric_atol), k


def run_recorded(overrides: list[str], tmp_path):
    """The small-config run of ``overrides`` on Flower's simulation engine with :func:`recording_app` writing what
    the nodes hold to ``tmp_path/nodes``; returns (experiment, result, that folder). The run goes to
    ``tmp_path/flower``."""
    from secure_fed.engine.flower.simulation import run_on_flower
    from tests.conftest import small_config

    nodes = tmp_path / "nodes"
    nodes.mkdir()
    cfg = small_config(*overrides, "backend=flower")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "flower")
    result = run_on_flower(exp, progress=False, client_app=recording_app(cfg, nodes))
    assert exp.executor.dropped == 0  # a node's failed check (e.g. a foreign client's state) would be a dropout
    return exp, result, nodes


def server_side_bytes(exp) -> bytes:
    """Everything the server holds after a run, as bytes: the messages it received and sent, its layers' and its own
    state, and every file in its run directory (checkpoints, summary, metrics)."""
    import pickle

    blob = pickle.dumps(exp.messages) + pickle.dumps(exp.stack.state_dict()) + pickle.dumps(exp.state_dict())
    for path in sorted(exp.run_dir.rglob("*")):
        if path.is_file():
            blob += path.read_bytes()
    return blob
