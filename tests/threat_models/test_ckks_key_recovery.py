"""Li–Micciancio key recovery against the ``ckks`` layer's released decryptions, on a real round.

The server holds the summed ciphertexts and gets their decryptions from a key holder. The control proves the attack
code right: from the complex slots of the same decryptions (taken here with the secret key) it recovers the key
exactly, and two rounds' ciphertexts agree. What the layer's key holder actually returns (the real parts, TenSEAL's
``decrypt``) gives candidates that are not the key and do not agree: the direct attack fails. If the key holders
ever released complex slots, the first assertion would fail."""

from __future__ import annotations

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from secure_fed.engine import Experiment
from tests.conftest import small_config
from threat_models.ckks_key_recovery import key_candidates, secret_key_words


def _server_holdings(tmp_path):
    """Two rounds of the ckks layer with the message log: per round, the summed ciphertexts the server sent the key
    holder and the values it got back; and the holder's secret context (ground truth, for scoring only)."""
    cfg = small_config("algorithm.name=fedavg", 'protocols=["ckks"]', "training.rounds=2", "output.log_messages=true",
                       "model.hidden_dims=[128]")  # an update over 4,096 values: its first ciphertext is full  # fmt: skip
    e = Experiment(cfg, run_dir=tmp_path)
    e.run(progress=False)
    layer = e.stack.by_name()["ckks"]
    sent = [m for m in e.messages if m["direction"] == "down" and "ckks_sums" in (m["message"] or {})]
    got = [m for m in e.messages if m["direction"] == "up" and "ckks_sum" in (m["message"] or {})]
    assert len(sent) == len(got) == 2 and [m["client"] for m in sent] == [m["client"] for m in got]
    rounds = [(a["message"]["ckks_sums"], b["message"]["ckks_sum"]) for a, b in zip(sent, got, strict=True)]
    return layer, rounds, layer._holders[sent[0]["client"]]["secret"]


def test_the_released_real_parts_do_not_give_the_key_where_complex_slots_would(tmp_path):
    layer, rounds, secret = _server_holdings(tmp_path)
    public = ts.context_from(layer.server_context_bytes)
    assert not public.is_private()
    assert all(released.dtype == np.float64 for _, released in rounds)  # real values, as TenSEAL's decrypt returns

    # every slot of the first ciphertext released (TenSEAL releases a vector's own slots; the others of a part-filled
    # ciphertext hold decryption error that the server never gets, which would block the attack by itself)
    assert all(ts.ckks_vector_from(public, summed[0]).size() == 4096 for summed, _ in rounds)

    # control: the complex slots of the same decryptions give the key, and the two rounds' ciphertexts agree on it
    sk_ctx = ts.context_from(secret)
    decryptor = sealapi.Decryptor(sk_ctx.seal_context().data, sk_ctx.secret_key().data)
    encoder = sealapi.CKKSEncoder(sk_ctx.seal_context().data)
    control = []
    for summed, released in rounds:  # every ciphertext's complex slots, cut to the vector's length as released
        slots = []
        for blob in summed:
            vec = ts.ckks_vector_from(public, blob)
            pt = sealapi.Plaintext()
            decryptor.decrypt(vec.ciphertext()[0], pt)
            slots.append(np.asarray(encoder.decode_complex(pt))[: vec.size()])
        complex_release = np.concatenate(slots)
        assert np.allclose(complex_release.real, released, atol=1e-6)  # the same decryptions, imaginary parts kept
        control.append(key_candidates(layer.server_context_bytes, summed, complex_release, limit=1)[0])
    truth = secret_key_words(secret, control[0].primes, control[0].words.shape[1])
    assert np.array_equal(control[0].words, truth) and control[0].agrees_with(control[1])

    # what the server really gets: the real parts; the same attack gives neither the key nor agreeing candidates
    got = [key_candidates(layer.server_context_bytes, summed, released, limit=1)[0] for summed, released in rounds]
    assert got[0].primes == control[0].primes
    assert not any(np.array_equal(c.words, truth) for c in got)
    assert not got[0].agrees_with(got[1])
    assert float(np.mean(got[0].words == truth)) < 1e-3  # not even close: a word matches with chance about 1/q
