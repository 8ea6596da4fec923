"""The flat vector a secure-sum layer masks or encrypts: ``UpdateLayout.flatten`` and its sliced view."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fed.engine.aggregation import UpdateLayout


def _reply():
    g = torch.Generator().manual_seed(0)
    return {
        "theta_delta": {"a": torch.randn(3, 5, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16)},
        "rows_delta": torch.randn(2, 4, generator=g),
        "row_ids": torch.tensor([3, 1]),
        "noise_share": torch.randn(6, 4, generator=g),
        "num_examples": 9,
        "loss": 0.25,
    }


def _expected(reply, w):
    """Written out by hand: w·Δθ in order, then 6 rows of 4 deltas (each row its delta plus the noise share), 6
    counts, then (w, loss, 1)."""
    out = [float(x) * w for x in reply["theta_delta"]["a"].reshape(-1).tolist()]
    out += [float(x) * w for x in reply["theta_delta"]["b"].float().reshape(-1).tolist()]
    ids = reply["row_ids"].tolist()
    for r in range(6):
        for c in range(4):
            own = float(reply["rows_delta"][ids.index(r), c]) if r in ids else 0.0
            out.append(own + float(reply["noise_share"][r, c]))
    out += [1.0 if r in ids else 0.0 for r in range(6)]
    return np.array([*out, w, 0.25, 1.0])


@pytest.mark.parametrize("weighting", ["num_examples", "uniform"])
def test_flatten_and_its_slices_are_the_update_in_layout_order(weighting):
    reply = _reply()
    layout = UpdateLayout.for_model({"a": torch.zeros(3, 5), "b": torch.zeros(7)}, 6, 4, full_table_keys=("noise_share",))
    want = _expected(reply, 9.0 if weighting == "num_examples" else 1.0)
    assert layout.size == len(want) == 15 + 7 + 6 * 5 + 3
    assert np.array_equal(layout.flatten(reply, weighting), want)
    view = layout.flat_view(reply, weighting)
    assert len(view) == len(want)
    rng = np.random.default_rng(1)
    cuts = [(0, len(want)), (14, 16), (21, 23), (22, 52), (51, 55), (54, 55), (10, 10)]
    cuts += [tuple(sorted(rng.integers(0, len(want) + 1, 2))) for _ in range(30)]
    for a, b in cuts:
        assert np.array_equal(view[a:b], want[a:b]), (a, b)
    with pytest.raises(IndexError):
        view[0:10:2]
