"""Secure aggregation on Flower, under keyed hashing and client-level DP (the acceptance stack): each round's
stages (advertise keys → share keys → masked input → unmasking) are messages to the nodes, whose round secrets
live in their context.state; simulated dropouts are recovered; the server receives masked words only and no
client secret; and the run equals the same run in process."""

from __future__ import annotations

import json

from tests.engine.flower.nodes import assert_same_run, run_in_process, run_recorded, server_side_bytes

STACK = ["protocols=[keyed_hashing, dp, secure_aggregation]", "privacy.noise_seed=5",
         "privacy.client={noise_multiplier: 0.8, clip_norm: 0.5}", "secure_aggregation.dropout=0.05",
         "training.rounds=3", "evaluation.every=3", "flower.num_supernodes=4", "output.log_messages=true"]  # fmt: skip


def test_keyed_hashing_dp_and_secure_aggregation_on_flower(tmp_path):
    fl, result, nodes_dir = run_recorded(STACK, tmp_path)
    assert result.summary["status"] == "completed" and result.summary["rounds_aborted"] == 0
    assert fl.executor.sent["train"] > 0 and fl.executor.sent["query"] > 4 * len(fl.fed.clients)  # stages as messages
    diag = [d for d in fl.diagnostics if "secagg_dropped" in d]
    assert len(diag) == 3 and sum(d["secagg_dropped"] for d in diag) > 0  # dropouts happened and were recovered

    # what reached the server: masked words for every update, no plaintext update, no client secret
    ups = [m["message"] for m in fl.messages if m["direction"] == "up"]
    masked = [m for m in ups if "masked" in m]
    assert masked and not any({"theta_delta", "rows_delta"} & set(m) for m in ups)
    secrets = []  # every client's X25519 keys, the run key and salt, each round's secagg keys and self-mask seeds
    for p in nodes_dir.glob("*.json"):
        v = json.loads(p.read_text())
        values = v if isinstance(v, list) else [v[k] for k in ("sk", "run_key", "salt")]  # (the pseudonym is public)
        secrets += [bytes.fromhex(x) for x in values if x]
    assert len(secrets) > 3 * len(fl.fed.clients)
    server_side = server_side_bytes(fl)
    assert not [s for s in secrets if s in server_side]
    assert fl.stack.by_name()["secure_aggregation"]._round_clients == {}  # the server holds no round secret
    assert fl.stack.by_name()["secure_aggregation"]._signers == {}  # nor any client's signing key
    assert list(nodes_dir.glob("secagg-sign-c*.json"))  # which the nodes hold (among the secrets checked above)

    rings = [json.loads(p.read_text()) for p in nodes_dir.glob("[0-9]*.json")]
    run_key, salt = bytes.fromhex(rings[0]["run_key"]), bytes.fromhex(rings[0]["salt"])
    local, local_result = run_in_process(STACK, tmp_path / "local", run_key=(run_key, salt))
    assert result.summary["privacy"] == local_result.summary["privacy"]
    assert_same_run(fl, result, local, local_result)
