"""A worker's log of its largest live buffers (:mod:`secure_fed.engine.flower.live_buffers`)."""

from __future__ import annotations

import numpy as np
import torch

from secure_fed.engine.flower.live_buffers import MEMLOG_ENV, largest_buffers, memlog_on


class Holder:
    pass


def test_the_largest_buffers_are_found_once_each_with_their_size_and_holder():
    h = Holder()
    h.array = np.zeros((1000, 1000))  # 7.6 MiB
    h.view = h.array[10:]  # the same memory: counted once, as its base
    kept = [b"x" * (3 << 20), torch.zeros(2_500_000), np.zeros(10)]  # 3 MiB, 9.5 MiB, too small to list
    found = largest_buffers(limit=50)
    mine = [b for b in found if b["held_by"] in ("Holder", "list")]
    assert [(b["mib"], b["what"]) for b in mine][:3] == [
        (9.5, "tensor float32[2500000]"), (7.6, "ndarray float64[1000, 1000]"), (3.0, "bytes"),
    ]  # fmt: skip
    assert sum(b["what"] == "ndarray float64[1000, 1000]" for b in found) == 1
    assert all(b["mib"] >= 1.0 for b in found)
    assert [b["mib"] for b in found] == sorted((b["mib"] for b in found), reverse=True)
    assert len(largest_buffers(limit=2)) == 2
    del h, kept


def test_the_log_is_off_unless_asked_for(monkeypatch):
    monkeypatch.delenv(MEMLOG_ENV, raising=False)
    assert not memlog_on()
    monkeypatch.setenv(MEMLOG_ENV, "1")
    assert memlog_on()
