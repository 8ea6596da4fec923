"""The message digest a Flower node keeps per client and round: canonical and lossless."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
import torch

from secure_fed.engine.message_digest import payload_digest


def test_payload_digest_is_equal_for_equal_payloads_only():
    """A node remembers a trained round by this digest: equal payloads (any key order) give one digest; a changed
    value, dtype, shape or key gives another (checked against hashlib over the same canonical bytes)."""
    base = {"theta": {"w": torch.arange(6.0).reshape(3, 2), "b": torch.zeros(2)}, "loss": "positive", "k": 3}
    same = {"k": 3, "loss": "positive", "theta": {"b": torch.zeros(2), "w": torch.arange(6.0).reshape(3, 2)}}
    assert payload_digest(base) == payload_digest(same)
    changed = [
        {**base, "theta": {**base["theta"], "w": base["theta"]["w"] + 1e-6}},
        {**base, "theta": {**base["theta"], "w": base["theta"]["w"].double()}},
        {**base, "theta": {**base["theta"], "w": base["theta"]["w"].reshape(2, 3)}},
        {**base, "k": 4},
        {**base, "extra": None},
    ]
    assert len({payload_digest(p) for p in [base, *changed]}) == len(changed) + 1
    t = torch.tensor([1.5, -2.0])

    def put(tag: bytes, data: bytes) -> bytes:  # the documented framing: tag, 8-byte little-endian length, data
        return tag + len(data).to_bytes(8, "little") + data

    want = put(b"D", b"1") + put(b"S", b"x") + put(b"T", b"torch.float32(2,)") + put(b"t", t.numpy().tobytes())
    assert payload_digest({"x": t}) == hashlib.sha256(want).digest()
    # lossless where repr is not: close floats in 0-d arrays, one element of a long array in a list, kinds
    close = [(np.array(0.123456789012), np.array(0.123456789013)), ([np.zeros(2000)], [np.r_[np.zeros(1999), 1.0]]),
             ((1,), [1]), (1, 1.0), (True, 1), (0.1, math.nextafter(0.1, 1.0)), (b"ab", "ab"), (None, "None")]  # fmt: skip
    for a, b in close:
        assert payload_digest(a) != payload_digest(b), (a, b)
    with pytest.raises(TypeError, match="has no digest"):
        payload_digest({"x": object()})
