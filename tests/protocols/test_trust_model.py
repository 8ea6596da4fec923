"""The trust model, where code can show it: the layers hold against an honest-but-curious server only.

The clients' X25519 public keys travel through the server unauthenticated, and CKKS has one secret key
that every key holder shares. These tests show what that means, so the README's claims stay true: a server
that swaps public keys reads the keyed-hashing run key, and one key holder colluding with the server
decrypts every individual CKKS update. (Both would need the active-adversary variants — identity keys
pinned by clients, threshold decryption — which secure-fed does not implement.)
"""

from __future__ import annotations

import numpy as np
import pytest
import tenseal as ts

from protocols.ckks import CKKSAggregation
from protocols.crypto import KeyPair, open_sealed
from protocols.keyed_hashing import KeyedHashing, _seal_info
from secure_fed.engine import Experiment
from tests.conftest import small_plan


def test_a_server_that_swaps_public_keys_reads_the_run_key(tmp_path):
    e = Experiment(small_plan('protocols=["keyed_hashing"]'), run_dir=tmp_path)
    layer = next(x for x in e.stack.layers if isinstance(x, KeyedHashing))
    clients = e.fed.clients
    pks = {c.client_id: layer._client_setup_fn({"keyed_hashing": "advertise"}, c)["public_key"] for c in clients}
    victim, dealer = 3, min(pks)
    mallory = KeyPair()  # the server's own pair, relayed in place of the victim's public key
    deal = layer._client_setup_fn({"keyed_hashing": "deal", "public_keys": {**pks, victim: mallory.public}}, clients[dealer])
    key = mallory.agree(pks[dealer], info=_seal_info(dealer, victim))
    stolen = open_sealed(key, deal["sealed"][victim], aad=_seal_info(dealer, victim))
    ring = layer._clients[dealer]
    assert stolen == ring.run_key + ring.salt  # the run key and salt: every token and pseudonym is now readable


def test_one_ckks_key_holder_colluding_with_the_server_decrypts_individual_updates(tmp_path):
    e = Experiment(small_plan("algorithm.name=fedavg", 'protocols=["ckks"]', "training.rounds=1", "output.log_messages=true"),
                   run_dir=tmp_path)  # fmt: skip
    e.setup()
    e.train_round()
    layer = next(x for x in e.stack.layers if isinstance(x, CKKSAggregation))
    assert not layer.server_context.is_private()  # the server alone cannot decrypt
    holder = min(layer._holders)
    secret = ts.context_from(layer._holders[holder]["secret"])  # what one key holder could hand the server
    wires = {m["client"]: m["message"] for m in e.messages if m["direction"] == "up" and "ciphertexts" in m["message"]}
    assert len(wires) == len(e.fed.clients)
    meta = layer.layout.segments()["meta"]
    plain = {}
    for cid, w in wires.items():
        dec = np.zeros(layer.num_blocks * layer.slots)  # with encrypt: [all] the update in layout order
        for b, blob in zip(w["ciphertext_blocks"].tolist(), w["ciphertexts"], strict=True):
            part = np.asarray(ts.ckks_vector_from(secret, blob).decrypt())
            dec[b * layer.slots : b * layer.slots + len(part)] = part
        plain[cid] = dec[: meta.stop]
    # each decrypted vector is one client's update: weight and count slots are 1 (a sum would hold the cohort size),
    # its loss slot is that client's training loss, and its θ part is a real, non-zero update
    theta = slice(0, layer.layout.segments()["rows"].start)
    for v in plain.values():
        assert abs(v[meta][0] - 1.0) < 1e-4 and abs(v[meta][2] - 1.0) < 1e-4 and v[meta][1] > 0
        assert np.linalg.norm(v[theta]) > 1e-3


def test_client_noise_shares_under_ckks_are_refused():
    """Under CKKS a plaintext group would reach the server with only a 1/√n noise share, and even with every group
    encrypted the key holders' approximate decryption is not the accounted discrete Gaussian release: refused."""
    from secure_fed.errors import ConfigError
    from tests.conftest import small_config as cfg

    ov = ["algorithm.name=fedavg", 'protocols=["dp", "ckks"]',
          'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5, "noise": "clients"}']  # fmt: skip
    for groups in ("[rows]", "[theta, rows]", "[all]"):
        with pytest.raises(ConfigError, match="CKKS decrypts approximately"):
            cfg(*ov, f"ckks.encrypt={groups}")
    cfg(*ov[:2], 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5, "noise": "server"}')  # the server's noise


def test_the_ckks_decryption_error_is_measured_and_kept_private(tmp_path):
    import json

    e = Experiment(small_plan("algorithm.name=fedavg", 'protocols=["ckks"]', "training.rounds=2"), run_dir=tmp_path)
    e.run(progress=False)
    diag = [json.loads(x) for x in (tmp_path / "private" / "diagnostics.jsonl").read_text().splitlines()]
    per_round = [d["ckks_max_abs_error"] for d in diag]
    run_max = json.loads((tmp_path / "private" / "summary.json").read_text())["protocols"]["ckks_max_abs_decryption_error"]
    assert all(0 < x < 1e-3 for x in per_round) and run_max == max(per_round)  # CKKS is approximate, not exact
    assert "ckks_max" not in (tmp_path / "summary.json").read_text()  # released summary: no private diagnostic
