"""A canonical, lossless SHA-256 of a message part (a payload, a plan): equal values, equal digests.

A Flower node keeps one per client and round, so that a round's DP randomness (addressed by the round) is never
spent on two different payloads or plans (``DifferentialPrivacy.check_round_payload``)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from secure_fed.models.group_updates import DeferredDelta
from secure_fed.models.sparse_rows import RowSparseDelta


def payload_digest(payload: Any) -> bytes:
    """SHA-256 of a decoded message part (a payload, a plan) in a canonical, lossless form: every value tagged by
    its kind; a tensor or array by dtype, shape and bytes; a row-sparse update by its shape, columns and values; a
    mapping by its entries in sorted key order; a list or tuple item by item; bytes and strings with their length;
    an int by its digits, a float exactly (``float.hex``). Equal values give equal digests, and any change of a
    value, dtype, shape, key or kind gives another; a value of any other kind is refused (TypeError)."""
    h = hashlib.sha256()

    def put(tag: bytes, data: bytes = b"") -> None:
        h.update(tag + len(data).to_bytes(8, "little") + data)

    def feed(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            put(b"T", f"{t.dtype}{tuple(t.shape)}".encode())
            put(b"t", t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(v, np.ndarray | np.generic):
            a = np.ascontiguousarray(v)
            put(b"N", f"{a.dtype.str}{a.shape}".encode())
            put(b"n", a.tobytes())
        elif isinstance(v, DeferredDelta):  # its value: the same digest as the dense update it stands for
            feed(v.to_dense())
        elif isinstance(v, RowSparseDelta):
            put(b"R", f"{tuple(v.shape)}".encode())
            feed(v.cols)
            feed(v.values)
        elif isinstance(v, dict):
            put(b"D", str(len(v)).encode())
            for k in sorted(v, key=lambda k: (type(k).__name__, str(k))):
                feed(k)
                feed(v[k])
        elif isinstance(v, list | tuple):
            put(b"L" if isinstance(v, list) else b"U", str(len(v)).encode())
            for x in v:
                feed(x)
        elif isinstance(v, bytes):
            put(b"B", v)
        elif isinstance(v, str):
            put(b"S", v.encode())
        elif isinstance(v, bool) or v is None:
            put(b"O", repr(v).encode())
        elif isinstance(v, int):
            put(b"I", str(v).encode())
        elif isinstance(v, float):
            put(b"F", v.hex().encode())
        else:
            raise TypeError(f"a {type(v).__name__} has no digest")

    feed(payload)
    return h.digest()


__all__ = ["payload_digest"]
