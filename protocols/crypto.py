"""Cryptographic primitives shared by the layers (all from ``cryptography`` / ``pycryptodome``).

* X25519 key agreement + HKDF-SHA256 → symmetric keys;
* AES-256-GCM sealing of a message from one client to another (the server
  only relays the ciphertext);
* a cryptographic pseudo-random generator (AES-256 in CTR mode) for masks —
  never numpy's RNG;
* Shamir secret sharing over GF(2^128) (pycryptodome) for 16- and 32-byte secrets.
"""

from __future__ import annotations

import os

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives import hashes
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


def prg_scratch(n: int) -> bytearray:
    """A buffer that :func:`prg_words` can write ``n`` words into again and again (``scratch=``)."""
    return bytearray(8 * n + 15)  # update_into wants a block's slack past what it writes


def prg_words(seed: bytes, n: int, *, bits: int = 64, scratch: bytearray | None = None) -> np.ndarray:
    """``n`` pseudo-random words uniform in [0, 2^bits), from AES-256-CTR keyed by ``seed`` (counter from 0).

    The key stream is written straight into the returned array (``update_into``, 1 MiB of zeros at a time), with
    no plaintext buffer of the output's size and no copy. With ``scratch`` (from :func:`prg_scratch`) the words are
    written into it and the result is a view of it, valid until its next use: a loop over many masks (secure
    aggregation's pairwise masks) then touches no fresh memory."""
    key = hkdf(seed, info=b"secure-fed mask prg", length=32) if len(seed) != 32 else seed
    enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()
    size = 8 * n
    out = prg_scratch(n) if scratch is None else scratch
    if len(out) < size + 15:
        raise ValueError(f"a PRG scratch buffer of {len(out)} bytes is too small for {n} words")
    view = memoryview(out)
    for o in range(0, size, _PRG_CHUNK):
        m = min(_PRG_CHUNK, size - o)
        enc.update_into(_ZEROS[:m], view[o : o + m + 15])
    words = np.frombuffer(out, dtype="<u8", count=n)
    if bits < 64:
        words &= np.uint64((1 << bits) - 1)
    return words


def shamir_split(secret: bytes, *, threshold: int, num_shares: int) -> list[tuple[int, bytes]]:
    """t-of-n shares of a 16- or 32-byte secret; share i is ``(i, bytes)`` with i in 1..n."""
    if len(secret) not in (16, 32):
        raise ValueError("Shamir sharing takes 16- or 32-byte secrets")
    halves = [secret[i : i + 16] for i in range(0, len(secret), 16)]
    parts = [Shamir.split(threshold, num_shares, h) for h in halves]
    return [(parts[0][j][0], b"".join(p[j][1] for p in parts)) for j in range(num_shares)]


def shamir_combine(shares: list[tuple[int, bytes]]) -> bytes:
    size = len(shares[0][1])
    out = b""
    for o in range(0, size, 16):
        out += Shamir.combine([(i, s[o : o + 16]) for i, s in shares])
    return out
