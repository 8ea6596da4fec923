"""Key recovery from released CKKS decryptions (Li and Micciancio, Eurocrypt 2021): what the server can do with the
decrypted sums the ``ckks`` layer's key holders send it.

The server adds the clients' ciphertexts itself, so it holds each summed ciphertext (c0, c1): polynomials in NTT
form, one array per prime q_j of the ciphertext's level. A key holder decrypts it, p = c0 + c1·s (mod each q_j),
and decodes p's canonical embedding into slot values. If the values it releases let the server re-encode p
*exactly*, then in each prime's NTT domain, where polynomial products are pointwise,

    s = (p − c0) · c1⁻¹   (mod q_j, coefficient by coefficient),

one decryption suffices, and with s the server decrypts every client's individual ciphertext. No ground truth is
needed to know that it worked: two ciphertexts give the same candidate only if it is the key.

TenSEAL's ``decrypt`` (what the layer's key holders return) gives only the real parts of the slots: half of what
fixes p, so the re-encoded polynomial differs from p and this linear solve gives no key. (It also returns only the
vector's own slots: in a part-filled ciphertext the others, which hold decryption error, stay with the key holder.)
Whether the real parts of many decryptions leak the key by a slower route (each fixes p + p(X⁻¹) up to the rounding
of halves, an equation in s with small errors) is not measured here; no countermeasure (noise flooding) is applied
either.

:func:`key_candidates` runs the attack on what the server holds; ``tests/threat_models/test_ckks_key_recovery.py``
runs it on a real round of the layer, and, as a control, on the complex slots of the same decryptions (taken with
the secret key), where it recovers the key.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from dataclasses import dataclass

import numpy as np
import tenseal as ts
import tenseal.sealapi as sealapi

#: SEAL's serialisation header: magic, header size, version, compression mode (0 none, 1 zlib, 2 zstd), size
_SEAL_HEADER = 16


def seal_words(obj, count: int) -> np.ndarray:
    """The last ``count`` 64-bit words of a SEAL object's serialisation (``save``): the polynomial data of a
    ciphertext, plaintext or secret key, laid out polynomial by polynomial, prime by prime, coefficient by
    coefficient (the metadata before them is skipped)."""
    fd, path = tempfile.mkstemp(suffix=".seal")
    os.close(fd)
    try:
        obj.save(path)
        with open(path, "rb") as f:
            blob = f.read()
    finally:
        os.unlink(path)
    mode, body = blob[5], blob[_SEAL_HEADER:]
    if mode == 2:
        import zstandard  # SEAL's default compression in TenSEAL's build

        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    elif mode == 1:
        body = zlib.decompress(body)
    elif mode != 0:
        raise ValueError(f"unknown SEAL compression mode {mode}")
    if len(body) < 8 * count:
        raise ValueError(f"a SEAL object of {len(body)} bytes holds fewer than {count} words")
    return np.frombuffer(body[len(body) - 8 * count :], dtype="<u8").copy()


@dataclass(frozen=True)
class Candidate:
    """The key that one summed ciphertext and its released decryption point to: NTT words per prime."""

    primes: tuple[int, ...]
    words: np.ndarray  #: (len(primes), N) uint64

    def agrees_with(self, other: Candidate) -> bool:
        return self.primes == other.primes and bool(np.array_equal(self.words, other.words))


def key_candidate(public: ts.Context, summed: bytes, released: np.ndarray) -> Candidate:
    """Solve c0 + c1·s = Encode(released) for s in each prime's NTT domain: ``summed`` a serialised CKKS vector
    (the server's sum), ``released`` its decryption as the key holder sent it (real values, or complex slots)."""
    vec = ts.ckks_vector_from(public, summed)
    ct = vec.ciphertext()[0]
    if not ct.is_ntt_form() or ct.size() != 2:
        raise ValueError("expects a two-polynomial CKKS ciphertext in NTT form")
    n, levels = ct.poly_modulus_degree(), ct.coeff_modulus_size()
    c = seal_words(ct, 2 * levels * n).reshape(2, levels, n)
    sctx = public.seal_context().data
    primes = tuple(q.value() for q in sctx.get_context_data(ct.parms_id()).parms().coeff_modulus())
    encoder = sealapi.CKKSEncoder(sctx)
    pt = sealapi.Plaintext()
    values = np.zeros(n // 2, dtype=np.complex128 if np.iscomplexobj(released) else np.float64)
    # the slots past the vector's length are not released: zero is the server's best guess, but they hold decryption
    # error, so the re-encoding is exact (and the attack works) only for a ciphertext the vector fills
    values[: len(released)] = released
    encoder.encode(values.tolist(), ct.parms_id(), ct.scale, pt)
    p = seal_words(pt, levels * n).reshape(levels, n)
    words = np.empty((levels, n), dtype=np.uint64)
    for j, q in enumerate(primes):
        c0, c1, pj = (a.astype(object) for a in (c[0, j], c[1, j], p[j]))
        words[j] = [((int(x) - int(y)) * pow(int(z), -1, q)) % q for x, y, z in zip(pj, c0, c1, strict=True)]
    return Candidate(primes, words)


def key_candidates(public_context: bytes, summed: list[bytes], released: np.ndarray, *, limit: int = 2) -> list[Candidate]:
    """The candidates of the first ``limit`` summed ciphertexts of a round, from what the server holds: the public
    context, the summed ciphertexts it sent the key holder and the concatenated values the key holder returned
    (``ckks_sum``; each ciphertext's share of it is as long as the vector it encrypts)."""
    public = ts.context_from(public_context)
    out, offset = [], 0
    for blob in summed:
        size = ts.ckks_vector_from(public, blob).size()
        if len(out) < limit:
            out.append(key_candidate(public, blob, np.asarray(released[offset : offset + size])))
        offset += size
    if offset != len(released):
        raise ValueError(f"the released values ({len(released)}) are not the ciphertexts' lengths ({offset})")
    return out


def secret_key_words(secret_context: bytes, primes: tuple[int, ...], n: int) -> np.ndarray:
    """Ground truth for scoring (the simulator's, never the attacker's): the key's NTT words for ``primes`` (the
    first primes of the key level)."""
    ctx = ts.context_from(secret_context)
    total = len(ctx.seal_context().data.key_context_data().parms().coeff_modulus())
    return seal_words(ctx.secret_key().data, total * n).reshape(total, n)[: len(primes)]


__all__ = ["Candidate", "key_candidate", "key_candidates", "seal_words", "secret_key_words"]
