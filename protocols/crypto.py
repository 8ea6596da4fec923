"""Cryptographic primitives shared by the layers (X25519, HKDF, AES from ``cryptography``; Shamir sharing here).

* X25519 key agreement + HKDF-SHA256 → symmetric keys;
* AES-256-GCM sealing of a message from one client to another (the server
  only relays the ciphertext);
* a cryptographic pseudo-random generator (AES-256 in CTR mode) for masks —
  never numpy's RNG;
* Shamir secret sharing over the prime field GF(2^521 − 1) for secrets of up to 64 bytes;
* Ed25519 long-term signing keys (:class:`SigningKey`, :func:`verify_signature`): a client's signature on its
  key advertisement and on the survivor set of secure aggregation's consistency check;
* a uniform permutation keyed by a 256-bit secret (:func:`secret_permutation`: Fisher–Yates on AES-CTR words).
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


class KeyPair:
    """An X25519 key pair. Only ``public`` (32 bytes) ever leaves its owner."""

    def __init__(self, private: X25519PrivateKey | None = None):
        self._sk = private or X25519PrivateKey.generate()
        self.public = self._sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> KeyPair:
        return cls(X25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        return self._sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def agree(self, peer_public: bytes, *, info: bytes, length: int = 32) -> bytes:
        """HKDF-SHA256 of the X25519 shared secret with ``peer_public``."""
        shared = self._sk.exchange(X25519PublicKey.from_public_bytes(peer_public))
        return hkdf(shared, info=info, length=length)


class SigningKey:
    """An Ed25519 long-term signing key: the private half stays with its client; ``public`` (32 bytes) goes into the
    directory every client pins (protocols.secagg.signing)."""

    def __init__(self, private: Ed25519PrivateKey | None = None):
        self._sk = private or Ed25519PrivateKey.generate()
        self.public = self._sk.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> SigningKey:
        return cls(Ed25519PrivateKey.from_private_bytes(raw))

    def private_bytes(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        return self._sk.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    def sign(self, message: bytes) -> bytes:
        return self._sk.sign(message)

    def __repr__(self) -> str:  # never print the key
        return f"SigningKey(public={self.public.hex()[:16]}…)"


def verify_signature(public: bytes, message: bytes, signature: object) -> bool:
    """Whether ``signature`` is ``public``'s Ed25519 signature on ``message`` (False for anything malformed)."""
    if not isinstance(signature, bytes | bytearray) or not isinstance(public, bytes | bytearray) or len(public) != 32:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public)).verify(bytes(signature), message)
    except (InvalidSignature, ValueError):
        return False
    return True


def secret_permutation(items: list, key: bytes) -> list:
    """A uniformly random order of ``items`` keyed by the whole of ``key`` (32 bytes): Fisher–Yates whose draws are
    64-bit words of AES-256-CTR under ``key`` (rejection sampling: no modulo bias). Without the key the order is
    unpredictable; with it, anyone redraws it."""
    if len(key) != 32:
        raise ValueError("secret_permutation takes a 32-byte key")
    out = list(items)
    n = len(out)
    if n < 2:
        return out
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()
    pool: list[int] = []

    def draw() -> int:
        if not pool:
            pool.extend(int(w) for w in np.frombuffer(enc.update(bytes(8 * 1024)), dtype="<u8")[::-1])
        return pool.pop()

    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = (1 << 64) - (1 << 64) % bound  # accept words below the largest multiple of bound
        while (w := draw()) >= limit:
            pass
        j = w % bound
        out[i], out[j] = out[j], out[i]
    return out


def hkdf(secret: bytes, *, info: bytes, length: int = 32, salt: bytes | None = None) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


def seal(key: bytes, plaintext: bytes, *, aad: bytes = b"") -> bytes:
    """AES-256-GCM: ``nonce (12 bytes) | ciphertext+tag``."""
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def open_sealed(key: bytes, blob: bytes, *, aad: bytes = b"") -> bytes:
    """Inverse of :func:`seal`; raises ``cryptography.exceptions.InvalidTag`` if tampered with."""
    return AESGCM(key).decrypt(blob[:12], blob[12:], aad)


#: AES-CTR's key stream is the encryption of zeros: one shared block of zeros, encrypted into the output in pieces
_PRG_CHUNK = 1 << 20
_ZEROS = memoryview(bytes(_PRG_CHUNK))


def word_dtype(bits: int) -> np.dtype:
    """The unsigned words that hold values mod 2^bits: 32-bit when ``bits`` ≤ 32, else 64-bit. A mask word is
    that many bytes of key stream, so 32-bit words halve the AES work (and the bytes sent) per value."""
    if not 1 <= bits <= 64:
        raise ValueError(f"a modulus of 2^{bits}: bits must be between 1 and 64")
    return np.dtype(np.uint32) if bits <= 32 else np.dtype(np.uint64)


def prg_scratch(n: int, *, bits: int = 64) -> bytearray:
    """A buffer that :func:`prg_words` can write ``n`` words (of :func:`word_dtype` ``(bits)``) into again and
    again (``scratch=``)."""
    return bytearray(word_dtype(bits).itemsize * n + 15)  # update_into wants a block's slack past what it writes


def prg_words(seed: bytes, n: int, *, bits: int = 64, scratch: bytearray | None = None) -> np.ndarray:
    """``n`` pseudo-random words uniform in [0, 2^bits), from AES-256-CTR keyed by ``seed`` (counter from 0): the
    key stream read as little-endian words of :func:`word_dtype` ``(bits)`` (4 or 8 bytes), each reduced mod 2^bits.

    The key stream is written straight into the returned array (``update_into``, 1 MiB of zeros at a time), with
    no plaintext buffer of the output's size and no copy. With ``scratch`` (from :func:`prg_scratch`) the words are
    written into it and the result is a view of it, valid until its next use: a loop over many masks (secure
    aggregation's pairwise masks) then touches no fresh memory."""
    key = _prg_key(seed)
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()
    dtype = word_dtype(bits)
    size = dtype.itemsize * n
    out = prg_scratch(n, bits=bits) if scratch is None else scratch
    if len(out) < size + 15:
        raise ValueError(f"a PRG scratch buffer of {len(out)} bytes is too small for {n} words")
    view = memoryview(out)
    for o in range(0, size, _PRG_CHUNK):
        m = min(_PRG_CHUNK, size - o)
        enc.update_into(_ZEROS[:m], view[o : o + m + 15])
    words = np.frombuffer(out, dtype=dtype.newbyteorder("<"), count=n)
    if bits < 8 * dtype.itemsize:
        words &= dtype.type((1 << bits) - 1)
    return words


#: the masks are summed a block of words at a time, so each block's key streams and sum stay in the L2 cache
MASK_BLOCK_WORDS = 1 << 15
assert MASK_BLOCK_WORDS * 4 % 16 == 0, "a mask block must start at an AES block for 4- and 8-byte words"


def _prg_key(seed: bytes) -> bytes:
    return hkdf(seed, info=b"secure-fed mask prg", length=32) if len(seed) != 32 else seed


def mask_threads() -> int:
    """Threads that :func:`add_masks` splits a vector over: the CPUs this process may run on, at most 8."""
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)))


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_POOL_PREFIX = "secure-fed-masks"


def _reset_pool_after_fork() -> None:  # a forked child inherits the pool object but not its threads
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=mask_threads(), thread_name_prefix=_POOL_PREFIX)
        return _POOL


def add_masks(
    out: np.ndarray, terms: list[tuple[bytes, int]], *, base: np.ndarray | None = None,
    fill: Callable[[int, np.ndarray], None] | None = None, bits: int = 64, threads: int | None = None,
) -> np.ndarray:  # fmt: skip
    """``out = base + Σ sign·PRG(seed) mod 2^bits`` over ``terms = [(seed, ±1)]`` (``base`` None: ``out`` itself),
    word for word the sum of :func:`prg_words` streams, and every word of the result reduced below 2^bits. ``out``
    (and ``base``) hold words of :func:`word_dtype` ``(bits)``.

    ``fill(offset, block)``, instead of ``base``, writes the base words of ``out[offset : offset + len(block)]``
    into ``block`` (e.g. fixed-point encoding of that slice of a real vector), on the thread that masks the block,
    while the block is in cache.

    The vector is cut into cache-sized blocks and every term's AES-CTR key stream is generated block by block (the
    counter started at the block's offset), so no stream of the vector's size is ever written to memory; the blocks
    are shared among ``threads`` threads (default :func:`mask_threads`; AES and numpy release the GIL)."""
    n = len(out)
    dtype = word_dtype(bits)
    if out.dtype != dtype or (base is not None and (base.dtype != dtype or len(base) != n)):
        raise ValueError(f"add_masks works mod 2^{bits} on {dtype} vectors of one length")
    if base is not None and fill is not None:
        raise ValueError("add_masks takes base or fill, not both")
    keys = [(_prg_key(seed), int(sign)) for seed, sign in terms]
    if any(sign not in (1, -1) for _, sign in keys):
        raise ValueError("a mask's sign is +1 or -1")
    w = dtype.itemsize
    low = dtype.type((1 << bits) - 1) if bits < 8 * w else None
    blocks = list(range(0, n, MASK_BLOCK_WORDS))
    parts = max(1, min(threads or mask_threads(), len(blocks)))

    def work(first: int, last: int) -> None:
        if first >= last:
            return
        o0 = blocks[first]
        # a block starts at a multiple of 16 bytes, i.e. at an AES block: its counter is that block's index
        ctr = (o0 * w // 16).to_bytes(16, "big")
        encs = [(Cipher(algorithms.AES(k), modes.CTR(ctr)).encryptor(), s) for k, s in keys]
        buf = bytearray(w * MASK_BLOCK_WORDS + 15)
        view = memoryview(buf)
        for o in blocks[first:last]:
            m = min(MASK_BLOCK_WORDS, n - o)
            blk = out[o : o + m]
            if base is not None:
                blk[...] = base[o : o + m]
            elif fill is not None:
                fill(o, blk)
            words = np.frombuffer(buf, dtype=dtype.newbyteorder("<"), count=m)
            for enc, sign in encs:
                enc.update_into(_ZEROS[: w * m], view[: w * m + 15])
                if sign > 0:
                    blk += words
                else:
                    blk -= words
            if low is not None:
                blk &= low

    cuts = [len(blocks) * i // parts for i in range(parts + 1)]
    if parts == 1 or threading.current_thread().name.startswith(_POOL_PREFIX):  # inline on a pool thread: no deadlock
        work(0, len(blocks))
    else:
        futures = [_pool().submit(work, a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
        wait(futures)  # every part finished (none still writing into ``out``) before an error is raised
        for f in futures:
            f.result()
    return out


#: Shamir's field: integers modulo the Mersenne prime 2^521 − 1 (a secret of up to 64 bytes is one element)
SHAMIR_PRIME = (1 << 521) - 1
_SHARE_BYTES = 66  # 521 bits


def shamir_split(secret: bytes, *, threshold: int, num_shares: int) -> list[tuple[int, bytes]]:
    """t-of-n Shamir shares of a secret of 1–64 bytes over GF(2^521 − 1): the secret is f(0) of a polynomial f of
    degree t − 1 whose other coefficients are drawn uniformly with :mod:`secrets`; share i is ``(i, f(i))`` for i in
    1..n, f(i) as 66 big-endian bytes after one byte of the secret's length (public: the length, not the secret).
    The field parts of any t − 1 shares are uniformly distributed whatever the secret; any t give it back
    (:func:`shamir_combine`)."""
    if not 1 <= len(secret) <= 64:
        raise ValueError("Shamir sharing takes secrets of 1 to 64 bytes")
    if not 1 <= threshold <= num_shares < SHAMIR_PRIME:
        raise ValueError(f"Shamir sharing needs 1 ≤ threshold ≤ num_shares, got {threshold} of {num_shares}")
    coeffs = [int.from_bytes(secret, "big")] + [secrets.randbelow(SHAMIR_PRIME) for _ in range(threshold - 1)]
    out = []
    for x in range(1, num_shares + 1):
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % SHAMIR_PRIME
        out.append((x, bytes([len(secret)]) + y.to_bytes(_SHARE_BYTES, "big")))
    return out


def shamir_combine(shares: list[tuple[int, bytes]]) -> bytes:
    """The secret from ``shares`` (at least the threshold's count of distinct ones), by Lagrange interpolation at 0.
    Raises ``ValueError`` when the shares do not interpolate to a secret of the recorded length (too few shares,
    or shares of different secrets): a check that fails only by chance, with probability about 2^(8·len − 521)
    (2^-265 for the 32-byte secrets secure aggregation shares)."""
    xs = [int(x) for x, _ in shares]
    if not shares or len(set(xs)) != len(xs) or any(not 0 < x < SHAMIR_PRIME for x in xs):
        raise ValueError("Shamir shares need distinct indices in 1..p−1")
    if any(len(s) != 1 + _SHARE_BYTES for _, s in shares):
        raise ValueError("Shamir shares of different formats")
    size = shares[0][1][0]
    if any(s[0] != size for _, s in shares):
        raise ValueError("Shamir shares of different formats")
    ys = [int.from_bytes(s[1:], "big") for _, s in shares]
    secret = 0
    for j, (xj, yj) in enumerate(zip(xs, ys, strict=True)):
        num = den = 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % SHAMIR_PRIME
                den = den * (xm - xj) % SHAMIR_PRIME
        secret = (secret + yj * num * pow(den, -1, SHAMIR_PRIME)) % SHAMIR_PRIME
    if secret >> (8 * size):
        raise ValueError("these Shamir shares do not determine a secret (too few of them, or of different secrets)")
    return secret.to_bytes(size, "big")
