"""Randomness that a DP guarantee relies on, drawn from a secret only the drawing party holds.

A Gaussian mechanism protects nothing against an adversary who can regenerate its noise, and
Poisson subsampling amplifies nothing against one who can regenerate the sample. Every such draw
in secure-fed (noise on sums, each client's noise share, the label sets and clients a round
samples) therefore comes from a :class:`SecretStream`: a 32-byte key from ``os.urandom`` held by
the party that performs the draw — the server's key in its private checkpoint
(``private/checkpoints/server_secrets.pt``), each client's key in the clients' own ``clients.pt`` — and
never in ``config.yaml``, ``summary.json``, ``metrics.jsonl``, a message or an attacker's view.

Each draw is addressed by a label (``"client-noise r12 fc1.weight"``): the output is
AES-256-CTR keyed by HKDF(key, label). So a resumed run redraws exactly what the interrupted one
would have drawn from the checkpointed key alone, with no generator state to save.

DP noise is drawn by :mod:`protocols.dp.discrete_gaussian` (an exact integer sampler over these words, released on
a public grid); :meth:`SecretStream.gaussian` (floating-point Box–Muller) is no DP draw: it serves CKKS's decryption
noise and the benchmark of the old noise path (``benchmarks/dp_noise.py``), and no DP module calls it (tested).

``privacy.noise_seed`` replaces the keys by ones derived from a number, for debugging; the run
then says that its ε does not hold against anyone who knows that number.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from protocols.crypto import hkdf, prg_words

_TWO_PI = 2.0 * math.pi


class SecretStream:
    """Labelled, reproducible-from-the-key draws: uniforms in (0, 1) and standard normals (float64)."""

    def __init__(self, key: bytes, *, derived_from_seed: bool = False):
        if len(key) != 32:
            raise ValueError("a SecretStream key has 32 bytes")
        self._key = bytes(key)
        #: True when the key follows from ``privacy.noise_seed`` (anyone who knows the seed can redraw)
        self.derived_from_seed = derived_from_seed

    @classmethod
    def fresh(cls) -> SecretStream:
        """A new secret from the operating system's CSPRNG."""
        return cls(os.urandom(32))

    @classmethod
    def from_noise_seed(cls, noise_seed: int, party: str) -> SecretStream:
        """Debugging only: a key that anyone who knows ``noise_seed`` can recompute."""
        raw = int(noise_seed).to_bytes(16, "little", signed=True)
        return cls(hkdf(raw, info=b"secure-fed noise_seed " + party.encode()), derived_from_seed=True)

    @classmethod
    def for_party(cls, noise_seed: int | None, party: str) -> SecretStream:
        return cls.fresh() if noise_seed is None else cls.from_noise_seed(noise_seed, party)

    def _words(self, label: str, n: int) -> np.ndarray:
        return prg_words(hkdf(self._key, info=b"secure-fed draw " + label.encode()), n, bits=64)

    def words(self, n: int, label: str) -> np.ndarray:
        """``n`` uniform 64-bit words (uint64) for ``label``: the raw AES-CTR stream."""
        return self._words(label, n)

    def word_reader(self, label: str) -> Callable[[int], np.ndarray]:
        """A reader of one AES-256-CTR key stream, keyed by HKDF(key, label): each call returns the next ``n`` words
        (uint64). The discrete Gaussian sampler (:mod:`protocols.dp.discrete_gaussian`) reads its words this way, many
        small reads a draw, with no key derivation or cipher set-up per read; what it returns is a function of the
        key, the label and the sequence of read sizes (which the sampler's own draws decide), so a resumed run
        rereads the same."""
        key = hkdf(self._key, info=b"secure-fed word stream " + label.encode())
        enc = Cipher(algorithms.AES(key), modes.CTR(b"\x00" * 16)).encryptor()
        zeros = bytearray(0)

        def read(n: int) -> np.ndarray:
            nonlocal zeros
            size = 8 * int(n)
            if len(zeros) < size:
                zeros = bytearray(max(size, 2 * len(zeros)))
            out = bytearray(size + 15)  # update_into wants a block's slack past what it writes
            enc.update_into(memoryview(zeros)[:size], out)
            return np.frombuffer(out, dtype="<u8", count=int(n))

        return read

    def uniform(self, n: int, label: str) -> np.ndarray:
        """``n`` draws uniform on (0, 1]: 53 random bits each, offset by half a step (never 0; the top value rounds
        to 1.0 in float64, which Box–Muller maps to a radius of 0: harmless)."""
        return ((self._words(label, n) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53

    def keyed_uniform(self, keys: np.ndarray, m: int, label: str) -> np.ndarray:
        """``(len(keys), m)`` draws uniform on (0, 1), row i a function of the secret, ``label`` and ``keys[i]`` alone
        (uint64): AES-256 keyed by HKDF(key, label) as a pseudo-random function of the 16-byte block (keys[i], j),
        two 53-bit draws a block. Rows of distinct keys are independent; a row does not depend on which other keys
        are drawn or in which order, so the draws of an instance (keyed by its content,
        :func:`secure_fed.algorithms.instance_keys.instance_keys`) stay with it when another instance is added or
        removed."""
        keys = np.ascontiguousarray(np.asarray(keys, dtype=np.uint64).reshape(-1))
        blocks = (int(m) + 1) // 2
        plain = np.empty((len(keys), blocks, 2), dtype="<u8")
        plain[:, :, 0] = keys[:, None]
        plain[:, :, 1] = np.arange(blocks, dtype=np.uint64)[None, :]
        key = hkdf(self._key, info=b"secure-fed keyed draw " + label.encode())
        enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
        words = np.frombuffer(enc.update(plain.tobytes()) + enc.finalize(), dtype="<u8").reshape(len(keys), 2 * blocks)
        return ((words[:, : int(m)] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53

    def gaussian(self, shape: tuple[int, ...] | torch.Size, label: str, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """Standard normals of ``shape`` (CPU) by the Box–Muller transform of secret uniforms.

        Not for DP noise: floating-point Gaussian noise is open to precision attacks (Mironov 2012); every DP draw
        is a discrete Gaussian on a grid (:mod:`protocols.dp.discrete_gaussian`).

        ``dtype=torch.float64`` (the default): both uniforms have 53 bits and the transform runs in float64.
        ``dtype=torch.float32``, for noise that is added to float32 or bf16 tensors anyway (client DP-SGD draws
        millions a step), about 4× faster: the radius √(−2 ln u₁) still comes from a 53-bit u₁ in float64, so the
        tails reach the same 8.7 standard deviations; the angle comes from a 24-bit u₂ and the cosine and sine run
        in float32 (an error of about 1e-7 on each draw, below the float32 rounding of the sum it is added to).
        """
        n = math.prod(shape)
        pairs = (n + 1) // 2
        if dtype == torch.float64:
            u = self.uniform(2 * pairs, label)
            r = np.sqrt(-2.0 * np.log(u[:pairs]))
            theta = _TWO_PI * u[pairs:]
            z = np.concatenate([r * np.cos(theta), r * np.sin(theta)])[:n]
            return torch.from_numpy(z).reshape(tuple(shape))
        if dtype != torch.float32:
            raise ValueError(f"SecretStream.gaussian draws float64 or float32, not {dtype}")
        words = self._words(label, pairs + (pairs + 1) // 2)  # 64-bit words for u1; two 32-bit halves for u2
        u1 = ((words[:pairs] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
        r = np.sqrt(-2.0 * np.log(u1)).astype(np.float32)
        halves = words[pairs:].view(np.uint32)[:pairs]
        theta = ((halves >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(_TWO_PI * 2.0**-24)
        z = np.empty(2 * pairs, dtype=np.float32)
        np.multiply(r, np.cos(theta), out=z[:pairs])
        np.multiply(r, np.sin(theta), out=z[pairs:])
        return torch.from_numpy(z[:n]).reshape(tuple(shape))

    # the key is the whole state; it lives only in its owner's private checkpoint
    def state_dict(self) -> dict:
        return {"key": self._key, "derived_from_seed": self.derived_from_seed}

    @classmethod
    def from_state_dict(cls, state: dict) -> SecretStream:
        return cls(state["key"], derived_from_seed=bool(state["derived_from_seed"]))

    def __repr__(self) -> str:  # never print the key
        return f"SecretStream(derived_from_seed={self.derived_from_seed})"
