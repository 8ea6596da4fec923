"""Fixed-point encoding of real vectors into Z_{2^bits} for secure aggregation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from secure_fed.errors import ConfigError


@dataclass(frozen=True)
class FixedPoint:
    """x ↦ round(clip(x, −R, R)·2^f) mod 2^bits; sums decode exactly while |Σ| < 2^(bits−1)/2^f."""

    clip_range: float
    frac_bits: int
    modulus_bits: int

    @property
    def mask(self) -> np.uint64:
        return np.uint64((1 << self.modulus_bits) - 1) if self.modulus_bits < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)

    def check_capacity(self, num_clients: int) -> None:
        """Refuse settings where the sum of ``num_clients`` clipped values could wrap around."""
        worst = num_clients * self.clip_range * 2.0**self.frac_bits
        if worst >= 2.0 ** (self.modulus_bits - 1):
            raise ConfigError(
                f"secure_aggregation: {num_clients} clients × clip_range {self.clip_range} × 2^{self.frac_bits} "
                f"overflows modulus 2^{self.modulus_bits}; lower clip_range or frac_bits, or raise modulus_bits"
            )

    def encode(self, x: np.ndarray) -> np.ndarray:
        return self.encode_into(x, np.empty(len(x), dtype=np.uint64))

    def encode_into(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """:meth:`encode` written into ``out`` (uint64, ``len(x)`` words), with one float temporary of x's size;
        secure aggregation calls it on cache-sized blocks while it adds the masks."""
        if len(x) != len(out):
            raise ValueError(f"encode_into: {len(x)} values into {len(out)} words")
        y = np.clip(x, -self.clip_range, self.clip_range)
        y *= 2.0**self.frac_bits
        np.rint(y, out=y)
        np.copyto(out.view(np.int64), y, casting="unsafe")  # |y| ≤ R·2^f < 2^63 (check_capacity): exact
        if self.modulus_bits < 64:
            out &= self.mask
        return out

    def decode_sum(self, s: np.ndarray) -> np.ndarray:
        s = s & self.mask
        half = np.uint64(1 << (self.modulus_bits - 1))
        signed = (
            s.astype(np.int64)
            if self.modulus_bits == 64
            else np.where(s >= half, s.astype(np.int64) - (1 << self.modulus_bits), s.astype(np.int64))
        )
        return signed.astype(np.float64) / 2.0**self.frac_bits
