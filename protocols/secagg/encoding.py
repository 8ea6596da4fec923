"""Fixed-point encoding of real vectors into Z_{2^bits} for secure aggregation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from protocols.crypto import word_dtype
from secure_fed.plugin_api.layers import ConfigError


@dataclass(frozen=True)
class FixedPoint:
    """x ↦ round(clip(x, −R, R)·2^f) mod 2^bits; sums decode exactly while |Σ| < 2^(bits−1)/2^f."""

    clip_range: float
    frac_bits: int
    modulus_bits: int

    @property
    def word_dtype(self) -> np.dtype:
        """uint32 for a modulus of at most 2^32, else uint64 (:func:`protocols.crypto.word_dtype`)."""
        return word_dtype(self.modulus_bits)

    @property
    def mask(self) -> np.unsignedinteger:
        return self.word_dtype.type((1 << self.modulus_bits) - 1)

    @staticmethod
    def max_frac_bits(clip_range: float, modulus_bits: int, num_clients: int) -> int:
        """The most fractional bits with which the sum of ``num_clients`` encoded values (each at most
        ⌈clip_range·2^f⌉ in absolute value, after rounding) cannot wrap around mod 2^``modulus_bits``; may be < 0
        (no precision fits)."""
        f = math.floor(math.log2(2.0 ** (modulus_bits - 1) / (num_clients * clip_range))) + 1
        while f > -64 and not FixedPoint._fits(clip_range, f, modulus_bits, num_clients):
            f -= 1
        return f

    @staticmethod
    def _fits(clip_range: float, frac_bits: int, modulus_bits: int, num_clients: int) -> bool:
        # exact integer arithmetic: the largest encoded magnitude is ⌈R·2^f⌉ (rint of a value ≤ R·2^f)
        return num_clients * math.ceil(clip_range * 2.0**frac_bits) < 1 << (modulus_bits - 1)

    def check_capacity(self, num_clients: int) -> None:
        """Refuse settings where the sum of ``num_clients`` clipped, rounded values could wrap around."""
        if not self._fits(self.clip_range, self.frac_bits, self.modulus_bits, num_clients):
            fits = self.max_frac_bits(self.clip_range, self.modulus_bits, num_clients)
            hint = f"frac_bits (at most {fits} fits)" if fits >= 4 else "frac_bits (none of 4 or more fits)"
            raise ConfigError(
                f"secure_aggregation: {num_clients} clients × clip_range {self.clip_range} × 2^{self.frac_bits} "
                f"overflows modulus 2^{self.modulus_bits}; lower clip_range or {hint}, or raise modulus_bits"
            )

    def encode(self, x: np.ndarray) -> np.ndarray:
        return self.encode_into(x, np.empty(len(x), dtype=self.word_dtype))

    def encode_into(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """:meth:`encode` written into ``out`` (``len(x)`` words of :attr:`word_dtype`), with one float temporary of
        x's size; secure aggregation calls it on cache-sized blocks while it adds the masks."""
        if len(x) != len(out):
            raise ValueError(f"encode_into: {len(x)} values into {len(out)} words")
        if out.dtype != self.word_dtype:
            raise ValueError(
                f"encode_into: a modulus of 2^{self.modulus_bits} is held in {self.word_dtype} words, not {out.dtype}"
            )
        y = np.clip(x, -self.clip_range, self.clip_range)
        y *= 2.0**self.frac_bits
        np.rint(y, out=y)
        # |y| ≤ ⌈R·2^f⌉ < 2^(bits−1) (check_capacity): exact in the signed type of the word's width, whose two's
        # complement is y mod 2^(word width)
        signed = np.int32 if self.word_dtype == np.uint32 else np.int64
        np.copyto(out.view(signed), y, casting="unsafe")
        if self.modulus_bits < 8 * self.word_dtype.itemsize:
            out &= self.mask
        return out

    def decode_sum(self, s: np.ndarray) -> np.ndarray:
        """A sum of encoded values (words mod 2^bits) back to reals: words of 2^(bits−1) and above are negative."""
        s = s & self.mask
        half = self.word_dtype.type(1 << (self.modulus_bits - 1))
        # sign extension within the word (the bits above the modulus set for a negative value), then the word read
        # as its signed type: no Python integer of 2^bits, which int64 cannot hold for bits = 63 or 64
        extended = np.where(s >= half, s | ~self.mask, s).astype(self.word_dtype, copy=False)
        signed = extended.view(np.int32 if self.word_dtype == np.uint32 else np.int64)
        return signed.astype(np.float64) / 2.0**self.frac_bits
