"""Li–Micciancio key recovery against the ``ckks`` layer's released decryptions, on real rounds.

The server holds the summed ciphertexts and gets their decryptions from a key holder. The controls prove the attack
code right: from *exact* decryptions of the same sums (taken here with the secret key) the complex slots of one, or
the real parts of two rounds, give the key exactly. What the layer's key holder returns carries Gaussian noise from
its own secret (``ckks.decryption_noise``): on it both attacks fail. Without that noise the layer would hand the
server its key after two rounds (the second control is that case)."""

from __future__ import annotations

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL
from threat_models.ckks_key_recovery import key_candidates, key_from_real_parts, secret_key_words


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


SLOTS = 4096  # poly_modulus_degree 8192


def _server_holdings(run_dir):
    """Two rounds of the ckks layer with the message log: per round, the summed ciphertexts the server sent the key
    holder and the values it got back; the layer; and the holder's secret context (ground truth, for scoring)."""
    plan = small_plan("algorithm.name=fedavg", 'protocols=["ckks"]', "training.rounds=2", "output.log_messages=true",
                       "model.hidden_dims=[128]")  # an update over 4,096 values: its first ciphertext is full  # fmt: skip
    e = build_experiment(plan, run_dir=run_dir)
    e.run(progress=False)
    layer = e.stack.by_name()["ckks"]
    sent = [m for m in e.messages if m["direction"] == "down" and "ckks_sums" in (m["message"] or {})]
    got = [m for m in e.messages if m["direction"] == "up" and "ckks_sum" in (m["message"] or {})]
    assert len(sent) == len(got) == 2 and [m["client"] for m in sent] == [m["client"] for m in got]
    rounds = [(a["message"]["ckks_sums"], b["message"]["ckks_sum"]) for a, b in zip(sent, got, strict=True)]
    return layer, rounds, layer._holders[sent[0]["client"]]["secret"]


def _exact_slots(public, secret: bytes, blob: bytes) -> np.ndarray:
    """Every complex slot of a summed ciphertext, decrypted exactly with the secret key (the controls only)."""
    sk_ctx = ts.context_from(secret)
    pt = sealapi.Plaintext()
    sealapi.Decryptor(sk_ctx.seal_context().data, sk_ctx.secret_key().data).decrypt(
        ts.ckks_vector_from(public, blob).ciphertext()[0], pt
    )
    return np.asarray(sealapi.CKKSEncoder(sk_ctx.seal_context().data).decode_complex(pt))


def test_exact_decryptions_give_the_key_and_the_layers_noisy_ones_do_not(tmp_path):
    layer, rounds, secret = _server_holdings(tmp_path / "a")
    public = ts.context_from(layer.server_context_bytes)
    assert not public.is_private()
    assert all(ts.ckks_vector_from(public, summed[0]).size() == SLOTS for summed, _ in rounds)  # full ciphertexts
    exact = [_exact_slots(public, secret, summed[0]) for summed, _ in rounds]

    # control 1: the complex slots of one exact decryption give the key (and two rounds agree on it)
    firsts = [summed[0] for summed, _ in rounds]
    one = [key_candidates(layer.server_context_bytes, [f], z, limit=1)[0] for f, z in zip(firsts, exact, strict=True)]
    truth = secret_key_words(secret, one[0].primes, 2 * SLOTS)
    assert np.array_equal(one[0].words, truth) and one[0].agrees_with(one[1])
    # control 2: the real parts of two exact decryptions give the key (what the layer would release without noise)
    two = key_from_real_parts(layer.server_context_bytes, *[(f, z.real) for f, z in zip(firsts, exact, strict=True)])
    assert np.array_equal(two.words, truth)

    # the layer's release: the exact values plus the holder's noise of the configured std ...
    released = [r[:SLOTS] for _, r in rounds]
    std = layer.settings.section.decryption_noise
    for r, z in zip(released, exact, strict=True):
        assert r.dtype == np.float64 and 0.9 * std < float(np.std(r - z.real)) < 1.1 * std
        assert abs(float(np.mean(r - z.real))) < 5 * std / SLOTS**0.5
    # ... on which neither attack finds the key
    noisy_one = key_candidates(layer.server_context_bytes, [firsts[0]], released[0], limit=1)[0]
    noisy_two = key_from_real_parts(layer.server_context_bytes, *zip(firsts, released, strict=True))
    for cand in (noisy_one, noisy_two):
        assert float(np.mean(cand.words == truth)) < 1e-3  # a word matches with chance about 1/q


def test_the_decryption_noise_is_the_key_holders_secret(tmp_path):
    """The same configuration and seed twice: every key holder's noise secret differs between the runs (os.urandom,
    nothing the server knows — config, seed, messages — regenerates it; ``test_keys_never_reach_server_objects_...``
    checks that the secret is on no server-side object), and the released sums differ by more than σ."""
    layer_a, rounds_a, _ = _server_holdings(tmp_path / "a")
    layer_b, rounds_b, _ = _server_holdings(tmp_path / "b")
    keys_a = {h: v["noise"] for h, v in layer_a._holders.items()}
    keys_b = {h: v["noise"] for h, v in layer_b._holders.items()}
    assert keys_a.keys() == keys_b.keys() and all(keys_a[h] != keys_b[h] for h in keys_a)
    a, b, std = rounds_a[0][1], rounds_b[0][1], layer_a.settings.section.decryption_noise
    assert np.allclose(a, b, atol=1e-4)  # the same round, up to the noise and CKKS's own error
    assert float(np.std(a - b)) > std  # independent draws: about √2 σ, and CKKS's own errors on top


def test_a_replayed_round_gets_fresh_noise_and_the_same_ciphertext_the_same(tmp_path):
    """A resumed run replays the rounds after its checkpoint with fresh encryptions of the same sums. Were the
    noise addressed by something that repeats (the round), the server would subtract the two releases and get an
    exact decryption of the difference of the two ciphertexts: two such pairs give the key. The key holder of a
    real run decrypts two encryptions of each of two vectors here, and the recovery from the differences fails;
    asking again for the same ciphertext gives the same values (nothing to average away)."""
    layer, _, secret = _server_holdings(tmp_path)
    holder = layer.holders[0]  # in process the layer object also holds the key holders' client-side state
    public = ts.context_from(layer.server_context_bytes)
    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(2):
        x = rng.normal(0.0, 1e-3, SLOTS)
        a, b = ts.ckks_vector(public, x), ts.ckks_vector(public, x)  # the same sum, encrypted again on replay
        pairs.append(((a - b).serialize(), layer._decrypt(holder, [a.serialize()]) - layer._decrypt(holder, [b.serialize()])))
    cand = key_from_real_parts(layer.server_context_bytes, *pairs)
    truth = secret_key_words(secret, cand.primes, 2 * SLOTS)
    assert float(np.mean(cand.words == truth)) < 1e-3
    blob = a.serialize()
    assert np.array_equal(layer._decrypt(holder, [blob]), layer._decrypt(holder, [blob]))
