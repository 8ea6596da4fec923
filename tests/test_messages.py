"""Message rules (``secure_fed/messages.py``) and the guard that applies them: every rule refuses what it
names, the guard refuses keys nobody declared, and visibility decides what of the server's model a client
may receive. Expected outcomes are written out by hand, not recomputed with the code under test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fed.engine.guard import MessageGuard
from secure_fed.errors import PrivacyViolation
from secure_fed.messages import (
    ByteList,
    CheckContext,
    FullTable,
    Indices,
    Number,
    OwnLabel,
    Params,
    RowIds,
    Rows,
    Setting,
    ShortBytes,
    Visibility,
)

SHAPES = {"theta": {"a": (2, 3), "b": (3,)}, "W": (5, 4)}
VIS = {"theta": Visibility.ALL, "W": Visibility.OWN_ROWS}


def ctx(own=(1,), vis=VIS):
    return CheckContext(SHAPES, vis, frozenset(own))


def theta():
    return {"a": torch.zeros(2, 3), "b": torch.zeros(3)}


@pytest.mark.parametrize(
    ("rule", "value", "ok"),
    [
        (Params("theta"), theta(), True),
        (Params("theta"), {"a": torch.zeros(2, 3)}, False),  # a parameter missing
        (Params("theta"), {"a": torch.zeros(3, 2), "b": torch.zeros(3)}, False),  # wrong shape
        (Params("theta"), {"a": [[0.0] * 3] * 2, "b": torch.zeros(3)}, False),  # not a tensor
        (Setting(), "positive", True),
        (Setting(), True, True),
        (Setting(), torch.zeros(1), False),
        (Number(), 3, True),
        (Number(), 0.5, True),
        (Number(), True, False),
        (Number(), torch.tensor(1.0), False),
        (ShortBytes(), b"x" * 64, True),
        (ShortBytes(), b"x" * 65, False),
        (ShortBytes(), "text", False),
        (ByteList(), [b"a", b"b" * 32], True),
        (ByteList(), [b"a", "b"], False),
        (ByteList(), [b"x" * 65], False),
        (OwnLabel(), 1, True),
        (OwnLabel(), 2, False),  # another client's label
        (OwnLabel(), True, False),
        (FullTable("W"), torch.zeros(5, 4), True),
        (FullTable("W"), torch.zeros(1, 4), False),
        (Indices(), np.array([0, 2, 7]), True),
        (Indices(), np.array([], dtype=np.int64), True),
        (Indices(), np.array([2, 2]), False),  # repeated
        (Indices(), np.array([5, 3], dtype=np.uint64), False),  # decreasing (np.diff would wrap for unsigned)
        (Indices(), np.array([-1, 2]), False),
        (Indices(), np.array([0.0, 1.0]), False),
        (Indices(), np.array([], dtype=np.float64), False),
        (Indices(), np.zeros((1, 2), dtype=np.int64), False),
    ],
)
def test_rules_accept_and_refuse(rule, value, ok):
    assert (rule.check("k", value, {"k": value}, ctx()) is None) == ok


def test_rows_rule_allows_only_the_clients_own_rows_of_the_right_width():
    rows = Rows("W")
    msg = {"rows": torch.zeros(1, 4), "row_ids": torch.tensor([1])}
    assert rows.check("rows", msg["rows"], msg, ctx(own=(1,))) is None
    assert "do not belong" in rows.check("rows", msg["rows"], msg, ctx(own=(2,)))
    bad = {"rows": torch.zeros(1, 3), "row_ids": torch.tensor([1])}
    assert "shape (1, 4)" in rows.check("rows", bad["rows"], bad, ctx())
    assert "needs 'row_ids'" in rows.check("rows", msg["rows"], {"rows": msg["rows"]}, ctx())
    assert "do not belong" in RowIds("W").check("row_ids", torch.tensor([0, 1]), {}, ctx(own=(1,)))


def test_visibility_decides_what_of_the_model_a_client_may_receive():
    msg = {"rows": torch.zeros(2, 4), "row_ids": torch.tensor([0, 3])}
    whole = {"theta": Visibility.ALL, "W": Visibility.ALL}  # e.g. the oracle's one client holds every label
    assert Rows("W").check("rows", msg["rows"], msg, ctx(own=(), vis=whole)) is None
    hidden = {"theta": Visibility.ALL, "W": Visibility.SERVER}
    assert "does not let clients see" in Rows("W").check("rows", msg["rows"], msg, ctx(own=(0, 3), vis=hidden))
    own_only = {"theta": Visibility.OWN_ROWS, "W": Visibility.OWN_ROWS}
    assert "whole" in Params("theta").check("theta", theta(), {}, ctx(vis=own_only))


def _guard(**kw):
    down = {"theta": Params("theta"), "rows": Rows("W"), "row_ids": RowIds("W")}
    up = {"theta_delta": Params("theta"), "loss": Number()}
    return MessageGuard(shapes=SHAPES, visibility=VIS, client_rows={0: {0}, 1: {1}}, down_rules=down, up_rules=up, **kw)


def test_guard_refuses_undeclared_keys_and_checks_declared_ones():
    log: list = []
    g = _guard(log=log)
    g.check_down(1, {"theta": theta(), "rows": torch.zeros(1, 4), "row_ids": torch.tensor([1])})
    with pytest.raises(PrivacyViolation, match="not allowed"):
        g.check_down(1, {"theta": theta(), "features": torch.zeros(3)})
    with pytest.raises(PrivacyViolation, match="do not belong"):
        g.check_down(0, {"rows": torch.zeros(1, 4), "row_ids": torch.tensor([1])})  # client 1's row to client 0
    with pytest.raises(PrivacyViolation, match="not allowed"):
        g.check_up(1, {"theta_delta": theta(), "rows_delta": torch.zeros(1, 4)})  # rows_delta was not declared up
    g.check_up(1, {"theta_delta": theta(), "loss": 0.1})
    assert [m["direction"] for m in log] == ["down", "up"]  # refused messages are never delivered nor logged


def test_guard_follows_a_new_row_order():
    g = _guard()
    g.set_client_rows({0: {3}, 1: {1}})
    g.check_down(0, {"rows": torch.zeros(1, 4), "row_ids": torch.tensor([3])})
    with pytest.raises(PrivacyViolation):
        g.check_down(0, {"rows": torch.zeros(1, 4), "row_ids": torch.tensor([0])})


def test_row_sparse_updates_only_where_declared_and_well_formed():
    """A θ update may carry a table's touched columns (uplink ``Params(row_sparse=True)``) only as distinct,
    sorted, in-range int64 columns with one value row each; the downlink's ``Params`` takes dense tensors only."""
    from secure_fed.models.sparse_rows import RowSparseDelta

    def upd(cols, rows=None):
        cols = torch.tensor(cols, dtype=torch.int64)
        return {"a": RowSparseDelta(cols, torch.zeros(len(cols) if rows is None else rows, 2), (2, 3)), "b": torch.zeros(3)}

    up, down = Params("theta", row_sparse=True), Params("theta")
    assert up.check("theta_delta", upd([0, 2]), {}, ctx()) is None
    assert up.check("theta_delta", upd([]), {}, ctx()) is None
    assert down.check("theta", upd([0, 2]), {}, ctx()) == "'theta' entry 'a' has the wrong shape"
    assert "not distinct, sorted and in range" in up.check("theta_delta", upd([2, 0]), {}, ctx())
    assert "not distinct, sorted and in range" in up.check("theta_delta", upd([1, 1]), {}, ctx())
    assert "not distinct, sorted and in range" in up.check("theta_delta", upd([0, 3]), {}, ctx())
    assert "not distinct, sorted and in range" in up.check("theta_delta", upd([-1, 0]), {}, ctx())
    assert "do not match its columns" in up.check("theta_delta", upd([0, 1], rows=3), {}, ctx())
    bad_shape = {"a": RowSparseDelta(torch.tensor([0]), torch.zeros(1, 2), (2, 4)), "b": torch.zeros(3)}
    assert up.check("theta_delta", bad_shape, {}, ctx()) == "'theta_delta' entry 'a' has the wrong shape"
    floats = {"a": RowSparseDelta(torch.tensor([0.0]), torch.zeros(1, 2), (2, 3)), "b": torch.zeros(3)}
    assert "not a 1-d int64 tensor" in up.check("theta_delta", floats, {}, ctx())
    grid = {"a": RowSparseDelta(torch.tensor([[0]]), torch.zeros(1, 2), (2, 3)), "b": torch.zeros(3)}
    assert "not a 1-d int64 tensor" in up.check("theta_delta", grid, {}, ctx())
    ints = {"a": RowSparseDelta(torch.tensor([0]), torch.zeros(1, 2, dtype=torch.int64), (2, 3)), "b": torch.zeros(3)}
    assert "not floating point" in up.check("theta_delta", ints, {}, ctx())


def test_row_sparse_delta_is_its_dense_update():
    from secure_fed.models.sparse_rows import RowSparseDelta, apply_delta

    d = RowSparseDelta(torch.tensor([1, 3]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]), (2, 4))
    want = torch.tensor([[0.0, 1.0, 0.0, 3.0], [0.0, 2.0, 0.0, 4.0]])
    assert torch.equal(d.to_dense(), want)
    t = torch.arange(8.0).reshape(2, 4)
    assert torch.equal(apply_delta(t, d), t + want)
    s = torch.zeros(2, 4)
    d.add_to(s, alpha=2.0)
    assert torch.equal(s, 2 * want)
