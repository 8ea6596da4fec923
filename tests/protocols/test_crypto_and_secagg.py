"""Secure aggregation: exact sums under dropouts, aborts below t, masks look uniform."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from cryptography.exceptions import InvalidTag
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from protocols.crypto import (
    SHAMIR_PRIME,
    KeyPair,
    add_masks,
    open_sealed,
    prg_scratch,
    prg_words,
    seal,
    shamir_combine,
    shamir_split,
    word_dtype,
)
from protocols.secagg.encoding import FixedPoint
from protocols.secagg.protocol import SecAggAbort, SecAggClient, SecAggServer, neighbour_graph, secure_sum
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
    for subset in itertools.combinations(shares, 3):
        assert shamir_combine(list(subset)) == secret
    assert shamir_combine(shares) == secret  # more than t: the same polynomial
    with pytest.raises(ValueError, match="do not determine"):
        shamir_combine(shares[:2])  # t−1 shares interpolate to a random field element, not a 32-byte secret


@pytest.mark.parametrize("t", [1, 2, 5, 17])
def test_shamir_shares_lie_on_a_degree_t_minus_1_polynomial_through_the_secret(t):
    """Checked without interpolation: the shares f(1..n) of a degree t−1 polynomial have t-th finite differences 0
    mod p, and Newton's forward differences give f(0) = Σ_k (−1)^k Δ^k f(1)."""
    p = SHAMIR_PRIME
    secret = bytes(range(7, 39))
    ys = [int.from_bytes(s[1:], "big") for _, s in shamir_split(secret, threshold=t, num_shares=t + 3)]
    diffs, table = ys, [ys]
    for _ in range(t):
        diffs = [(b - a) % p for a, b in itertools.pairwise(diffs)]
        table.append(diffs)
    assert all(d == 0 for d in table[t])
    f0 = sum((-1) ** k * table[k][0] for k in range(t)) % p
    assert f0 == int.from_bytes(secret, "big")


@pytest.mark.parametrize("t", [3, 5])
def test_fewer_than_t_shamir_shares_have_no_fixed_relation(t):
    """The t − 1 shares f(1..t−1) of a secret must be jointly uniform: fixed linear combinations of them take a new
    value in every split. (Coefficients drawn once and reused, a₁ = a₂ = …, would make some combination a
    function of the secret alone: for t = 3, f(2) − 3·f(1) = −2s.)"""
    p = SHAMIR_PRIME
    secret = bytes(range(32))
    rng = np.random.default_rng(t)
    combos = [[int(c) for c in rng.integers(1, 1000, t - 1)] for _ in range(4)]
    if t == 3:
        combos.append([-3, 1])  # f(2) − 3·f(1)
    seen: list[set[int]] = [set() for _ in combos]
    for _ in range(200):
        ys = [int.from_bytes(sh[1:], "big") for _, sh in shamir_split(secret, threshold=t, num_shares=t)[: t - 1]]
        for k, c in enumerate(combos):
            seen[k].add(sum(ci * yi for ci, yi in zip(c, ys, strict=True)) % p)
    assert all(len(v) == 200 for v in seen)


def test_shamir_rejects_malformed_shares():
    with pytest.raises(ValueError):
        shamir_combine([(1, b"")])
    with pytest.raises(ValueError):
        shamir_combine([(1, b"\x20" + bytes(66)), (1, b"\x20" + bytes(66))])  # the same index twice


def test_the_server_aborts_on_shares_that_do_not_reconstruct_and_on_a_malformed_masked_input():
    n, size = 4, 50
    clients = {u: SecAggClient(u, 0, [v for v in range(n) if v != u], 3) for u in range(n)}
    server = SecAggServer(round_idx=0, graph={u: c.neighbours for u, c in clients.items()}, threshold=3, bits=64)
    pks = server.collect_keys({u: c.advertise() for u, c in clients.items()})
    inbox = server.route_shares({u: c.share_keys(pks) for u, c in clients.items()})
    for u, c in clients.items():
        c.receive_shares(inbox[u])
    with pytest.raises(SecAggAbort, match="uint64 vector"):
        server.add_masked(0, np.zeros(size, dtype=np.float64))
    for u, c in clients.items():
        server.add_masked(u, c.masked_input(np.zeros(size, dtype=np.uint64), list(range(n)), 64))
    with pytest.raises(SecAggAbort, match="round's length"):
        server.add_masked(0, np.zeros(size + 1, dtype=np.uint64))
    survived, dropped = server.request_unmasking()
    replies = {u: c.unmask(survived, dropped) for u, c in clients.items()}
    rand = np.random.default_rng(1)
    forged = {v: {u: (kind, (i, bytes([sh[0]]) + rand.bytes(66))) for u, (kind, (i, sh)) in per.items()}
              for v, per in replies.items()}  # fmt: skip
    with pytest.raises(SecAggAbort, match="do not reconstruct"):
        server.unmask(forged, size)
    assert np.array_equal(server.unmask(replies, size), np.zeros(size, dtype=np.uint64))


def test_a_neighbourhood_of_more_than_255_clients_shares_and_reconstructs():
    """Shamir x-coordinates travel in 2 bytes (one byte failed for a complete graph of more than 255 clients)."""
    n = 300
    clients = {u: SecAggClient(u, 0, [v for v in range(n) if v != u], 2) for u in (0, 299)}
    pks = {u: SecAggClient(u, 0, [], 2).advertise() for u in range(n)} | {u: c.advertise() for u, c in clients.items()}
    sealed = clients[299].share_keys(pks)
    clients[0].peers_c[299] = pks[299]["c_pk"]
    clients[0].receive_shares({299: sealed[0]})
    (xb, b_share), _ = clients[0].held_shares[299]
    xb_own, b_own = clients[299].held_shares[299][0]
    assert (xb, xb_own) == (1, 300)  # client 0 holds index 1, client 299 its own index 300
    assert shamir_combine([(xb, b_share), (xb_own, b_own)]) == clients[299].b_seed


def test_fewer_than_t_shamir_shares_are_uniform_whatever_the_secret():
    """t = 2: the one share f(1) = s + a must be uniform in GF(p) for a zero and an all-ones secret (a fixed or
    low-entropy coefficient would show in the top byte's distribution); shares of one secret never repeat."""
    for secret in (bytes(32), b"\xff" * 32):
        ys = [int.from_bytes(shamir_split(secret, threshold=2, num_shares=2)[0][1][1:], "big") for _ in range(4000)]
        assert len(set(ys)) == len(ys)
        top = [y >> (521 - 4) for y in ys]  # the top 4 of 521 bits: 16 equally likely cells
        assert stats.chisquare(np.bincount(top, minlength=16)).pvalue > 1e-7


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
    # a modulus of at most 2^32: the same stream read as 4-byte words (half the key stream per word)
    ref32 = np.frombuffer(AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=bytes(16)).encrypt(bytes(4 * n)), dtype="<u4")
    assert prg_words(key, n, bits=32).dtype == np.uint32 and np.array_equal(prg_words(key, n, bits=32), ref32)
    assert np.array_equal(prg_words(key, n, bits=20), ref32 & np.uint32(2**20 - 1))
    scratch = prg_scratch(n + 3)  # a reused buffer (larger than needed) holds the same words
    prg_words(b"j" * 32, n + 3, scratch=scratch)
    assert np.array_equal(prg_words(key, n, scratch=scratch), ref)


@pytest.mark.parametrize("n", [1, 4, 32_768, 32_769, 3 * 32_768 + 6])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("bits", [64, 40, 32, 20])
def test_add_masks_is_the_signed_sum_of_aes_256_ctr_key_streams(n, threads, bits):
    """Against another library's AES-256-CTR (pycryptodome), each stream from counter 0, summed mod 2^bits in
    Python integers: across the 32,768-word blocks and the threads' spans (each starts its counter mid-stream).
    Up to 2^32 the words are 4 bytes of key stream each (uint32), above it 8 (uint64)."""
    from Crypto.Cipher import AES

    width = 4 if bits <= 32 else 8
    dtype = np.dtype(f"<u{width}")
    rng = np.random.default_rng(n)
    base = rng.integers(0, 2 ** (8 * width - 1), size=n, dtype=dtype)
    terms = [(bytes([i]) * 32, sign) for i, sign in zip(range(1, 5), (1, -1, -1, 1), strict=True)]
    want = base.astype(object)
    for seed, sign in terms:
        stream = AES.new(seed, AES.MODE_CTR, nonce=b"", initial_value=bytes(16)).encrypt(bytes(width * n))
        want = want + sign * np.frombuffer(stream, dtype=dtype).astype(object)
    want = np.array([int(v) % 2**bits for v in want], dtype=dtype)
    with pytest.raises(ValueError, match="vectors of one length"):  # words of the other width are refused
        add_masks(np.empty(n, dtype=np.uint64 if width == 4 else np.uint32), terms, bits=bits)
    out = np.empty(n, dtype=dtype)
    assert np.array_equal(add_masks(out, terms, base=base, bits=bits, threads=threads), want)
    assert np.array_equal(add_masks(base.copy(), terms, bits=bits, threads=threads), want)  # in place
    seen = []  # the base written block by block on the masking threads (``fill``), each block's words once

    def fill(o, blk):
        seen.append((o, len(blk)))
        blk[...] = base[o : o + len(blk)]

    got = add_masks(np.full(n, 7, dtype=dtype), terms, fill=fill, bits=bits, threads=threads)
    assert np.array_equal(got, want)
    assert sorted(seen) == [(o, min(32_768, n - o)) for o in range(0, n, 32_768)]


@pytest.mark.parametrize("bits", [64, 63, 48, 33, 32, 24])
def test_fixed_point_encoding_is_the_rounded_scaled_clipped_value_mod_2_bits(bits):
    """Against Python integers: round(clip(x, −R, R)·2^f) mod 2^bits, into a given vector and into a new one, in
    uint32 words up to 2^32 and uint64 words above."""
    fp = FixedPoint(3.0, 20, bits)
    dtype = np.uint32 if bits <= 32 else np.uint64
    assert fp.word_dtype == dtype
    x = np.array([0.0, 1e-7, -1e-7, 0.3, -0.3, 2.9999, -2.9999, 3.5, -7.0, 0.5 / 2**20, -1.5 / 2**20])
    want = np.array([round(min(max(v, -3.0), 3.0) * 2**20) % 2**bits for v in x.tolist()], dtype=dtype)
    out = np.full(len(x), np.iinfo(dtype).max - 5, dtype=dtype)
    assert fp.encode_into(x, out) is out and np.array_equal(out, want)
    assert np.array_equal(fp.encode(x), want)
    assert np.allclose(fp.decode_sum(fp.encode(x) + fp.encode(x)), 2 * np.clip(x, -3, 3), atol=2**-20)
    # a sum that used every bit but the sign decodes exactly at both ends (2^(bits−1) − 1 and −2^(bits−1) + 1)
    top = (1 << (bits - 1)) - 1
    edge = np.array([top, (1 << bits) - top], dtype=dtype)
    assert fp.decode_sum(edge).tolist() == [top / 2**20, -top / 2**20]


def test_words_of_the_wrong_width_are_refused():
    with pytest.raises(ValueError, match="between 1 and 64"):
        word_dtype(65)
    with pytest.raises(ValueError, match="uint32 words, not uint64"):
        FixedPoint(1.0, 20, 32).encode_into(np.zeros(3), np.zeros(3, dtype=np.uint64))
    graph = neighbour_graph(list(range(3)), None, seed=0)
    server = SecAggServer(round_idx=0, graph=graph, threshold=2, bits=32)
    with pytest.raises(SecAggAbort, match="not a uint32 vector"):
        server.add_masked(0, np.zeros(5, dtype=np.uint64))


def test_the_server_can_hold_the_running_sum_only():
    """``keep_inputs=False`` (the layer's setting unless messages are logged): the transcript notes each masked
    input without keeping it, and the sum is still exact."""
    n, size = 4, 1000
    xs = {u: np.random.default_rng(u).integers(0, 2**20, size=size, dtype=np.uint64) for u in range(n)}
    for keep in (True, False):
        graph = neighbour_graph(list(range(n)), None, seed=0)
        server = SecAggServer(round_idx=0, graph=graph, threshold=3, bits=64, keep_inputs=keep)
        clients = {u: SecAggClient(u, 0, graph[u], 3) for u in range(n)}
        pks = server.collect_keys({u: c.advertise() for u, c in clients.items()})
        inbox = server.route_shares({u: c.share_keys(pks) for u, c in clients.items()})
        for u, c in clients.items():
            c.receive_shares(inbox[u])
        for u, c in clients.items():
            server.add_masked(u, c.masked_input(xs[u], list(range(n)), 64))
        kept = [y for kind, _, y in server.transcript if kind == "masked_input"]
        assert len(kept) == n and all((y is not None) == keep for y in kept)
        replies = {u: c.unmask(server.u3, set()) for u, c in clients.items()}
        assert np.array_equal(server.unmask(replies, size), sum(xs.values()))


def test_fixed_point_capacity_error_names_the_keys():
    with pytest.raises(ConfigError, match="clip_range"):
        FixedPoint(1e6, 30, 32).check_capacity(100)
    # rounding counts: ⌈R·2^f⌉ = 2^30 here, and two such values reach 2^31 (they would decode as negative)
    with pytest.raises(ConfigError, match="overflows modulus 2"):
        FixedPoint((2**30 - 0.25) / 2**4, 4, 32).check_capacity(2)
    with pytest.raises(ConfigError, match=r"none of 4 or more fits"):
        FixedPoint(1e6, 20, 32).check_capacity(1000)  # 1000 × 1e6 × 2^f < 2^31 only for f ≤ 1
    # the largest frac_bits it names fits, and one more does not: 159 × 1 × 2^23 < 2^31 ≤ 159 × 2^24
    with pytest.raises(ConfigError, match=r"frac_bits \(at most 23 fits\)"):
        FixedPoint(1.0, 24, 32).check_capacity(159)
    FixedPoint(1.0, 23, 32).check_capacity(159)
    assert FixedPoint.max_frac_bits(1.0, 32, 159) == 23 and FixedPoint.max_frac_bits(8.0, 32, 128) == 20
    assert FixedPoint.max_frac_bits(1.0, 32, 128) == 23  # 128 × 2^23 = 2^30 < 2^31, and 2^24 would reach it


@pytest.mark.parametrize("check", [True, False])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(4, 9),
    t_frac=st.floats(0.55, 1.0),
    data=st.data(),
)
def test_sum_is_exact_under_random_dropouts(check, n, t_frac, data):
    """Complete graph (SecAgg): exact while ≥ t survive every stage and, with the consistency check, while
    ⌈(|U1| + t)/2⌉ of the share holders U1 sign U3; SecAggAbort otherwise."""
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
    u1, u3 = n - len(drop["advertise"]), n - len(drop["advertise"] | drop["share"] | drop["input"])
    quorum_ok = not check or 2 * u3 >= u1 + t  # every share holder group is U1 on the complete graph
    # every live count along the way is ≥ the final one, so the protocol must succeed iff ≥ t remain at the end
    if survivors >= t and quorum_ok:
        total, u3, server = secure_sum(enc, threshold=t, drop=drop, consistency_check=check)
        assert u3 == set(range(n)) - drop["advertise"] - drop["share"] - drop["input"]
        expect = np.zeros(17, dtype=np.uint64)
        for u in u3:
            expect = expect + enc[u]
        assert np.array_equal(total, expect)  # exact in Z_{2^64}
        assert np.allclose(fp.decode_sum(total), sum(xs[u] for u in u3), atol=len(u3) * 2.0**-16)
    else:
        with pytest.raises(SecAggAbort, match="quorum" if survivors >= t else "threshold|quorum" if check else "threshold"):
            secure_sum(enc, threshold=t, drop=drop, consistency_check=check)


@pytest.mark.parametrize("bits", [64, 40, 32, 20])
@settings(max_examples=5, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.sampled_from([4, 6]))
def test_sparse_graph_sum_is_exact_with_dropouts(seed, k, bits):
    """The unmasked sum equals the inputs' sum mod 2^bits, computed in Python integers."""
    rng = np.random.default_rng(seed)
    n = 20
    dtype = np.uint32 if bits <= 32 else np.uint64
    enc = {u: rng.integers(0, 2**bits, size=9, dtype=np.uint64).astype(dtype) for u in range(n)}
    drop = {"input": {int(rng.integers(n))}}
    total, u3, _ = secure_sum(enc, threshold=0.6, neighbors=k, drop=drop, graph_seed=seed, bits=bits)
    expect = [sum(int(enc[u][i]) for u in u3) % 2**bits for i in range(9)]
    assert total.dtype == dtype and total.tolist() == expect and len(u3) == n - 1


def test_graph_is_symmetric():
    g = neighbour_graph(list(range(30)), 6, seed=1)
    assert all(u in g[v] for u in g for v in g[u]) and all(len(v) == 6 for v in g.values())


@pytest.mark.parametrize("bits", [64, 40, 32, 24])
def test_masked_vector_is_uniform_whatever_the_input(bits):
    """A single masked vector: every word in Z_{2^bits} (under 2^64 the words of an unreduced sum would carry its
    wrap-arounds, which depend on the input), chi-square on its low bytes and its top 4 bits, for an all-zero and
    an all-large input."""
    n, size = 5, 40_000
    for value in (0, 2 ** (bits - 1) - 1):
        x = np.full(size, value, dtype=np.uint64 if bits > 32 else np.uint32)
        clients = {u: SecAggClient(u, 0, [v for v in range(n) if v != u], 3) for u in range(n)}
        pks = {u: c.advertise() for u, c in clients.items()}
        for c in clients.values():
            c.share_keys(pks)
        y = clients[0].masked_input(x, list(range(n)), bits)
        assert int(y.max()) < 2**bits
        assert y.dtype == x.dtype
        counts = np.bincount(y.view(np.uint8).reshape(size, y.itemsize)[:, : bits // 8].ravel(), minlength=256)
        # 16 tests in all at p > 1e-7 (at 1e-3 an honest mask failed one run in about 60); a biased mask gives p ≈ 0
        assert stats.chisquare(counts).pvalue > 1e-7
        top = (y >> y.dtype.type(bits - 4)).astype(int)  # the top 4 bits, 16 cells
        assert stats.chisquare(np.bincount(top, minlength=16)).pvalue > 1e-7


def test_a_client_masks_one_input_a_round():
    """The round's masks hide one input: a second masked input (the same masks on another x) would give the
    server the difference of the two in the clear, so it is refused, also after the client's state round trip."""
    n, size = 3, 64
    clients = {u: SecAggClient(u, 5, [v for v in range(n) if v != u], 2) for u in range(n)}
    pks = {u: c.advertise() for u, c in clients.items()}
    for c in clients.values():
        c.share_keys(pks)
    c0 = clients[0]
    y1 = c0.masked_input(np.zeros(size, dtype=np.uint64), list(range(n)), 64)
    with pytest.raises(PermissionError, match="second masked input in round 5"):
        c0.masked_input(np.ones(size, dtype=np.uint64), list(range(n)), 64)
    again = SecAggClient.from_state(c0.state())
    with pytest.raises(PermissionError, match="second masked input"):
        again.masked_input(np.ones(size, dtype=np.uint64), list(range(n)), 64)
    old = {k: v for k, v in c0.state().items() if k != "masked"}  # state saved before the flag existed
    assert SecAggClient.from_state(old).masked is False
    assert y1.shape == (size,)
