"""Secure aggregation: exact sums under dropouts, aborts below t, masks look uniform."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from protocols.crypto import KeyPair, open_sealed, prg_scratch, prg_words, seal, shamir_combine, shamir_split
from protocols.secagg.encoding import FixedPoint
from protocols.secagg.protocol import SecAggAbort, SecAggClient, neighbour_graph, secure_sum
from secure_fed.errors import ConfigError

STAGES = ("advertise", "share", "input", "unmask")


def test_seal_roundtrip_and_tamper():
    a, b = KeyPair(), KeyPair()
    k_ab = a.agree(b.public, info=b"x")
    assert k_ab == b.agree(a.public, info=b"x")
    blob = seal(k_ab, b"secret", aad=b"ctx")
    assert open_sealed(k_ab, blob, aad=b"ctx") == b"secret"
    with pytest.raises(InvalidTag):
        open_sealed(k_ab, blob[:-1] + bytes([blob[-1] ^ 1]), aad=b"ctx")


def test_shamir_needs_t_shares():
    secret = bytes(range(32))
    shares = shamir_split(secret, threshold=3, num_shares=5)
    assert shamir_combine(shares[1:4]) == secret
    assert shamir_combine(shares[:2]) != secret  # t−1 shares give garbage


def test_prg_is_deterministic_and_key_dependent():
    a = prg_words(b"k" * 32, 1000)
    assert np.array_equal(a, prg_words(b"k" * 32, 1000))
    assert not np.array_equal(a, prg_words(b"j" * 32, 1000))
    assert prg_words(b"k" * 32, 1000, bits=20).max() < 2**20


@pytest.mark.parametrize("n", [0, 1, 131_071, 131_072, 131_073, 3 * 131_072 + 5])
def test_prg_is_the_aes_256_ctr_key_stream(n):
    """Against another library's AES-256-CTR (pycryptodome), counter block from 0, across the 1 MiB pieces the
    PRG encrypts in (131,072 words each); ``bits`` keeps the low bits of the same words."""
    from Crypto.Cipher import AES

    key = bytes(range(32))
    ref = np.frombuffer(AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=bytes(16)).encrypt(bytes(8 * n)), dtype="<u8")
    assert np.array_equal(prg_words(key, n), ref)
    assert np.array_equal(prg_words(key, n, bits=40), ref & np.uint64(2**40 - 1))
    scratch = prg_scratch(n + 3)  # a reused buffer (larger than needed) holds the same words
    prg_words(b"j" * 32, n + 3, scratch=scratch)
    assert np.array_equal(prg_words(key, n, scratch=scratch), ref)


def test_fixed_point_capacity_error_names_the_keys():
    with pytest.raises(ConfigError, match="clip_range"):
        FixedPoint(1e6, 30, 32).check_capacity(100)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(4, 9),
    t_frac=st.floats(0.55, 1.0),
    data=st.data(),
)
def test_sum_is_exact_under_random_dropouts(n, t_frac, data):
    """Complete graph (SecAgg): exact while ≥ t survive every stage; SecAggAbort otherwise."""
    t = max(1, int(np.ceil(t_frac * n)))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    fp = FixedPoint(50.0, 16, 64)
    xs = {u: rng.normal(size=17) for u in range(n)}
    enc = {u: fp.encode(x) for u, x in xs.items()}
    alive, drop = set(range(n)), {}
    for stage in STAGES:
        k = data.draw(st.integers(0, n - 1))
        d = set(rng.choice(sorted(alive), size=min(k, len(alive)), replace=False).tolist()) if alive else set()
        drop[stage] = d
        alive -= d
    survivors = n - sum(len(d) for d in drop.values())
    # every live count along the way is ≥ the final one, so the protocol must succeed iff ≥ t remain at the end
    if survivors >= t:
        total, u3, server = secure_sum(enc, threshold=t, drop=drop)
        assert u3 == set(range(n)) - drop["advertise"] - drop["share"] - drop["input"]
        expect = np.zeros(17, dtype=np.uint64)
        for u in u3:
            expect = expect + enc[u]
        assert np.array_equal(total, expect)  # exact in Z_{2^64}
        assert np.allclose(fp.decode_sum(total), sum(xs[u] for u in u3), atol=len(u3) * 2.0**-16)
    else:
        with pytest.raises(SecAggAbort, match="threshold"):
            secure_sum(enc, threshold=t, drop=drop)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.sampled_from([4, 6]))
def test_sparse_graph_sum_is_exact_with_dropouts(seed, k):
    rng = np.random.default_rng(seed)
    n = 20
    enc = {u: rng.integers(0, 2**63, size=9, dtype=np.uint64) for u in range(n)}
    drop = {"input": {int(rng.integers(n))}}
    total, u3, _ = secure_sum(enc, threshold=0.6, neighbors=k, drop=drop, graph_seed=seed)
    expect = np.zeros(9, dtype=np.uint64)
    for u in u3:
        expect = expect + enc[u]
    assert np.array_equal(total, expect) and len(u3) == n - 1


def test_graph_is_symmetric():
    g = neighbour_graph(list(range(30)), 6, seed=1)
    assert all(u in g[v] for u in g for v in g[u]) and all(len(v) == 6 for v in g.values())


def test_masked_vector_is_uniform_whatever_the_input():
    """A single masked vector: chi-square on its bytes, for an all-zero and an all-large input."""
    n, size = 5, 40_000
    for value in (0, 2**63 - 1):
        x = np.full(size, value, dtype=np.uint64)
        clients = {u: SecAggClient(u, 0, [v for v in range(n) if v != u], 3) for u in range(n)}
        pks = {u: c.advertise() for u, c in clients.items()}
        for c in clients.values():
            c.share_keys(pks)
        y = clients[0].masked_input(x, list(range(n)), 64)
        counts = np.bincount(y.view(np.uint8), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-3
        top = (y >> np.uint64(60)).astype(int)  # the top 4 bits, 16 cells
        assert stats.chisquare(np.bincount(top, minlength=16)).pvalue > 1e-3
