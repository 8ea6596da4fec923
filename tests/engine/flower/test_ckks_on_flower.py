"""CKKS on Flower: the key holders' exchange, the public context's broadcast and each round's decryption of the
sum are messages to the nodes (their keys in context.state), encryption is the plan's last step on the node; the
server holds only the public context and adds ciphertexts, and the run matches in process up to CKKS's error."""

from __future__ import annotations

import json

import tenseal as ts

from tests.conftest import small_config
from tests.engine.flower.nodes import assert_same_run, run_in_process, run_recorded, server_side_bytes

RUN = ["protocols=[ckks]", "algorithm.name=fedaws", "training.rounds=2", "evaluation.every=2", "ckks.key_holders=2",
       "flower.num_supernodes=4", "output.log_messages=true"]  # fmt: skip
ONE_INSTANCE = 100 / small_config(*RUN).dataset.synthetic.num_test + 1e-9  # a ranking metric's step, in points


def test_ckks_on_flower(tmp_path):
    fl, result, nodes = run_recorded(RUN, tmp_path)
    assert result.summary["status"] == "completed"
    ck = fl.stack.by_name()["ckks"]
    assert ck._holders == {} and ck._client_public is None  # no key, not even the clients' copy, on the server
    assert not ts.context_from(ck.server_context_bytes).is_private()
    ups = [m["message"] for m in fl.messages if m["direction"] == "up"]
    updates = [m for m in ups if "ciphertexts" in m]
    assert len(updates) == 2 * len(fl.fed.clients) and not any("theta_delta" in m for m in ups)
    sums = [m for m in ups if "ckks_sum" in m]
    assert len(sums) == 2  # one decryption of the sum per round, by a key holder
    # the key holders' secrets, read back from their nodes' state: two holders, the same secret context, and none
    # of it (X25519 keys, the secret key at the serialised context's tail) in anything the server has
    held = [json.loads(p.read_text()) for p in nodes.glob("ckks-holder-*.json")]
    assert len(held) == 2 and len({h[1] for h in held}) == 1 and ts.context_from(bytes.fromhex(held[0][1])).is_private()
    secrets = [bytes.fromhex(h[0]) for h in held] + [bytes.fromhex(held[0][1])[-4096:]] + [bytes.fromhex(h[2]) for h in held]
    server_side = server_side_bytes(fl)
    assert not [s for s in secrets if s in server_side]

    local, local_result = run_in_process(RUN, tmp_path / "local")
    # CKKS adds its own approximation error (about 1e-6 here) on either side, and independent decryption noise;
    # that can swap two near-tied scores, which moves a ranking metric by one test instance (ONE_INSTANCE points)
    assert_same_run(fl, result, local, local_result, atol=1e-4, metric_atol=ONE_INSTANCE)


def test_ckks_row_blocks_on_flower_are_those_in_process(tmp_path):
    """8 rows of 1,024 values, 4 to a ciphertext, then counts and meta in a third: each client sends its row's block
    and the last one, through the Flower codec and the guard, the same blocks as in process."""
    run = [*RUN, "ckks.encrypt=[rows]", "model.embedding_dim=1024", "training.rounds=1"]
    fl, result, _ = run_recorded(run, tmp_path)
    local, local_result = run_in_process(run, tmp_path / "local")

    def blocks(exp):
        return sorted((m["client"], m["message"]["ciphertext_blocks"].tolist()) for m in exp.messages
                      if m["direction"] == "up" and "ciphertexts" in m["message"])  # fmt: skip

    on_flower = blocks(fl)
    assert on_flower == blocks(local) and len(on_flower) == len(fl.fed.clients)
    assert {tuple(b) for _, b in on_flower} == {(0, 2), (1, 2)}
    assert_same_run(fl, result, local, local_result, atol=1e-4, metric_atol=ONE_INSTANCE)
