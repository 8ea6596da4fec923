"""Key recovery from released CKKS decryptions (Li and Micciancio, Eurocrypt 2021): what the server can do with the
decrypted sums the ``ckks`` layer's key holders send it.

The server adds the clients' ciphertexts itself, so it holds each summed ciphertext (c0, c1): polynomials in NTT
form, one array per prime q_j of the ciphertext's level. A key holder decrypts it, p = c0 + c1·s (mod each q_j),
and decodes p's canonical embedding into slot values. If the values it releases let the server re-encode p
*exactly*, then in each prime's NTT domain, where polynomial products are pointwise,

    s = (p − c0) · c1⁻¹   (mod q_j, coefficient by coefficient),

one decryption suffices, and with s the server decrypts every client's individual ciphertext. No ground truth is
needed to know that it worked: two ciphertexts give the same candidate only if it is the key.

TenSEAL's ``decrypt`` returns only the real parts of the slots, half of what fixes p: the one-decryption solve
then gives no key. But the real parts fix p + σ(p) (σ: X ↦ X⁻¹), one linear equation in s and σ(s), and two
decryptions solve it (:func:`key_from_real_parts`). Measured on a real round of the layer
(``tests/threat_models/test_ckks_key_recovery.py``): from exact decryptions, the complex slots of one or the real
parts of two give the key. So the layer's key holders add Gaussian noise from their own secret to every value they
return (``ckks.decryption_noise``), and on what they return both attacks fail. That noise turns the linear system
into a noisy one (ring-LWE-like, with errors of about 2 × 181 in p + σ(p)'s coefficients at the defaults); it
is not the statistical noise flooding that IND-CPA-D security proofs need, and no such security is claimed.

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


def _ntt_words(public: ts.Context, summed: bytes, values: np.ndarray):
    """The summed ciphertext's (c0, c1) and Encode(values) at its level and scale, in NTT form per prime (arrays of
    shape (2, L, N) and (L, N)); with the primes. ``values`` fills the first slots, zeros the rest."""
    ct = ts.ckks_vector_from(public, summed).ciphertext()[0]
    if not ct.is_ntt_form() or ct.size() != 2:
        raise ValueError("expects a two-polynomial CKKS ciphertext in NTT form")
    n, levels = ct.poly_modulus_degree(), ct.coeff_modulus_size()
    c = seal_words(ct, 2 * levels * n).reshape(2, levels, n)
    sctx = public.seal_context().data
    primes = tuple(q.value() for q in sctx.get_context_data(ct.parms_id()).parms().coeff_modulus())
    slots = np.zeros(n // 2, dtype=np.complex128 if np.iscomplexobj(values) else np.float64)
    slots[: len(values)] = values
    pt = sealapi.Plaintext()
    sealapi.CKKSEncoder(sctx).encode(slots.tolist(), ct.parms_id(), ct.scale, pt)
    return c, seal_words(pt, levels * n).reshape(levels, n), primes


def key_candidate(public: ts.Context, summed: bytes, released: np.ndarray) -> Candidate:
    """Solve c0 + c1·s = Encode(released) for s in each prime's NTT domain: ``summed`` a serialised CKKS vector
    (the server's sum), ``released`` its decryption as the key holder sent it (real values, or complex slots).
    The slots past the vector's length are not released: zero is the server's best guess, but they hold decryption
    error, so the re-encoding is exact (and the attack works) only for a ciphertext the vector fills."""
    c, p, primes = _ntt_words(public, summed, np.asarray(released))
    words = np.empty(p.shape, dtype=np.uint64)
    for j, q in enumerate(primes):
        words[j] = [((int(x) - int(y)) * pow(int(z), -1, q)) % q for x, y, z in zip(p[j], c[0, j], c[1, j], strict=True)]
    return Candidate(primes, words)


def key_from_real_parts(public_context: bytes, first: tuple[bytes, np.ndarray], second: tuple[bytes, np.ndarray]) -> Candidate:
    """The key from the real parts of two decryptions of full ciphertexts (two rounds' sums, say).

    The real parts of the slots fix the polynomial p + σ(p), σ: X ↦ X⁻¹ (complex conjugation of the slots): the
    server re-encodes twice the released values and gets it exactly. So each decryption gives, in NTT form,

        c1·s + σ(c1)·σ(s) = (p + σ(p)) − c0 − σ(c0),

    where σ of a polynomial in SEAL's NTT form (bit-reversed evaluation points ψ^(2·brv(i)+1)) is the array
    reversed: slot i and slot N − 1 − i are evaluations at inverse points. At each pair of slots (i, N − 1 − i)
    that is one linear equation in s_i and s_(N−1−i); two decryptions give two, solved here by Cramer's rule.
    Exact decryptions give the key; noisy ones (``ckks.decryption_noise``) give garbage."""
    public = ts.context_from(public_context)
    (c, P, primes), (c2, P2, primes2) = (_ntt_words(public, b, 2.0 * np.asarray(r, dtype=np.float64)) for b, r in (first, second))
    if primes != primes2:
        raise ValueError("the two ciphertexts are at different levels")
    n = P.shape[1]
    if any(len(r) != n // 2 for _, r in (first, second)):
        raise ValueError(f"needs every slot of full ciphertexts ({n // 2} values each)")
    rev = np.arange(n)[::-1]
    words = np.empty((len(primes), n), dtype=np.uint64)
    for j, q in enumerate(primes):
        t1 = [(int(a) - int(b) - int(d)) % q for a, b, d in zip(P[j], c[0, j], c[0, j][rev], strict=True)]
        t2 = [(int(a) - int(b) - int(d)) % q for a, b, d in zip(P2[j], c2[0, j], c2[0, j][rev], strict=True)]
        a1, a2 = [int(x) for x in c[1, j]], [int(x) for x in c2[1, j]]
        for i in range(n):
            k = n - 1 - i
            det = (a1[i] * a2[k] - a1[k] * a2[i]) % q
            words[j, i] = (t1[i] * a2[k] - a1[k] * t2[i]) * pow(det, -1, q) % q if det else 0
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


__all__ = ["Candidate", "key_candidate", "key_candidates", "key_from_real_parts", "seal_words", "secret_key_words"]
