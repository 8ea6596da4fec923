"""The Flower codec carries every payload the engine builds, exactly, and refuses what it cannot carry."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ConfigRecord
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from hypothesis import given, settings
from hypothesis import strategies as st

from secure_fed.engine.flower.codec import CodecError, decode, encode

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool]


def _tensor(draw_shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(draw_shape, generator=g, dtype=torch.float64) * 100
    return t.to(dtype)


leaves = st.one_of(
    st.integers(-(2**62), 2**62), st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8), st.booleans(),
    st.none(),
    st.builds(_tensor, st.lists(st.integers(0, 4), max_size=3), st.sampled_from(DTYPES), st.integers(0, 1000)),
    # homogeneous lists and tuples (one layout entry each), and near misses that must keep their item types
    st.lists(st.integers(-(2**70), 2**70), max_size=5), st.lists(st.binary(max_size=40), max_size=5),
    st.lists(st.one_of(st.integers(0, 3), st.booleans()), max_size=5),
    st.lists(st.integers(0, 9), max_size=4).map(tuple), st.lists(st.binary(max_size=4), max_size=4).map(tuple),
)  # fmt: skip
payloads = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 100)), inner, max_size=4),
    ),
    max_leaves=20,
)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _over_the_wire(record):
    """Through Flower's own protobuf serialisation, as a message crosses a real network."""
    return recorddict_from_proto(recorddict_to_proto(record))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.one_of(st.text(max_size=6), st.integers(0, 9)), payloads, max_size=5))
def test_any_payload_comes_back_with_the_same_types_and_values(payload):
    assert _same(payload, decode(encode(payload)))
    assert _same(payload, decode(_over_the_wire(encode(payload))))


def test_non_contiguous_and_small_dtypes_round_trip():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()  # a transposed view
    small = {str(d): torch.arange(6).to(d) for d in (torch.float16, torch.int8, torch.int16)}
    payload = {"t": t, **small}
    assert _same(payload, decode(_over_the_wire(encode(payload))))


def test_anything_beside_the_layout_is_refused():
    """A record, an array, a value or a meta key the layout does not name cannot ride along past the guard."""
    base = {"theta": {"w": torch.ones(2)}, "tokens": [b"a"]}
    extra_array = encode(base)
    extra_array["arrays"]["p/raw"] = Array(np.arange(3.0))
    extra_value = encode(base)
    extra_value["values"]["p/raw"] = b"secret"
    extra_record = encode(base)
    extra_record["leak"] = ConfigRecord({"x": 1})
    for record in (extra_array, extra_value, extra_record):
        with pytest.raises(CodecError):
            decode(record)
    with_meta = encode(base)
    with_meta["meta"] = ConfigRecord({"seq": 0, "raw": b"x"})
    with pytest.raises(CodecError, match="raw"):
        decode(with_meta, meta_keys=frozenset({"seq"}))
    with_meta["meta"] = ConfigRecord({"seq": 0})
    assert _same(base, decode(with_meta, meta_keys=frozenset({"seq"})))


def test_engine_payload_shapes_round_trip():
    theta = {"fc.weight": torch.randn(5, 3), "fc.bias": torch.randn(5)}
    payload = {"theta": theta, "rows": torch.randn(1, 4), "row_ids": [3], "loss": math.nan, "tokens": [b"\x00a", b"b"],
               "pair": (1, "x"), "n": np.int64(7), "mask": np.arange(4, dtype=np.uint8),
               "masked": np.array([0, 2**32 - 1, 2**31], dtype=np.uint32),  # secure aggregation's 32-bit words
               "masked64": np.array([0, 2**64 - 1], dtype=np.uint64)}  # fmt: skip
    back = decode(encode(payload))
    for k in ("masked", "masked64"):
        assert back[k].dtype == payload[k].dtype and np.array_equal(back[k], payload[k])
    assert torch.equal(back["theta"]["fc.weight"], theta["fc.weight"]) and back["row_ids"] == [3]
    assert math.isnan(back["loss"]) and back["tokens"] == [b"\x00a", b"b"] and back["pair"] == (1, "x")
    assert back["n"] == 7 and type(back["n"]) is int and np.array_equal(back["mask"], payload["mask"])
    # the decoded tensors are the receiver's own (writable, not views of the message)
    back["theta"]["fc.bias"].add_(1.0)


def test_what_cannot_travel_is_refused_naming_the_key():
    with pytest.raises(CodecError, match="payload.fn"):
        encode({"fn": lambda: 0})
    with pytest.raises(CodecError, match="complex"):
        encode({"z": torch.zeros(2, dtype=torch.complex64)})


def test_row_sparse_update_round_trips_and_a_bad_shape_is_refused():
    from secure_fed.models.sparse_rows import RowSparseDelta

    d = RowSparseDelta(torch.tensor([0, 5, 9]), torch.randn(3, 4), (4, 10))
    back = decode(recorddict_from_proto(recorddict_to_proto(encode({"theta_delta": {"w": d}}))))["theta_delta"]["w"]
    assert isinstance(back, RowSparseDelta) and back.shape == (4, 10)
    assert torch.equal(back.cols, d.cols) and torch.equal(back.values, d.values)
    rec = encode({"u": d})
    rec["values"]["layout"] = rec["values"]["layout"].replace("[4, 10]", '[4, "x"]')
    with pytest.raises(CodecError, match="row-sparse update's shape"):
        decode(rec)
    rec = encode({"u": d})
    rec["values"]["layout"] = rec["values"]["layout"].replace(", [4, 10]]", "]")
    with pytest.raises(CodecError, match="not \\(columns, values, shape\\)"):
        decode(rec)


def test_a_layout_that_does_not_match_its_bytes_or_its_kinds_is_refused():
    """Bytes past the last one the layout names cannot ride along; a layout that names bytes the message does not
    carry, a list of ints holding something else, a key named twice or an entry of no known kind are refused."""
    base = {"sessions": {3: b"k" * 32, 5: b"m" * 32}, "shares": [[1, 2], [3, 4]], "tag": b"t"}
    assert _same(base, decode(_over_the_wire(encode(base))))
    tail = encode(base)
    tail["values"]["bytes"] = tail["values"]["bytes"] + b"secret"
    short = encode(base)
    short["values"]["bytes"] = short["values"]["bytes"][:-1]
    floats = encode(base)
    floats["values"]["layout"] = floats["values"]["layout"].replace("[1, 2]", "[1, 2.5]")
    twice = encode(base)
    twice["values"]["layout"] = twice["values"]["layout"].replace("[3, 5]", "[3, 3]")
    unknown = encode(base)
    unknown["values"]["layout"] = unknown["values"]["layout"].replace('{"b": 1}', '{"z": 1}')
    extra_value = encode(base)
    extra_value["values"]["p/raw"] = b"secret"
    cases = {"tail": (tail, "bytes its layout does not name"), "short": (short, "does not carry"),
             "floats": (floats, "list of ints"), "twice": (twice, "twice"), "unknown": (unknown, "no known kind"),
             "extra value": (extra_value, "values are")}  # fmt: skip
    for record, message in cases.values():
        with pytest.raises(CodecError, match=message):
            decode(record)


def test_many_small_secrets_are_a_few_layout_entries():
    """A node's SecAgg+-shaped state (per client: a dict of 100 peers' 32-byte session keys, 100 share pairs) is
    two ConfigRecord values and a layout with fewer entries than half its 7,000 keys, ints and bytes values (one
    entry per value, and one ConfigRecord value per bytes value, is what made a Bibtex node's state slow)."""
    state = {c: {"peer_sessions": {p: bytes([p % 256]) * 32 for p in range(100)},
                 "held_shares": {p: [[p, 7 * p], [1, 2]] for p in range(100)}} for c in range(10)}  # fmt: skip
    record = encode(state)
    assert set(record["values"].keys()) == {"layout", "bytes"} and len(record["values"]["bytes"]) == 10 * 100 * 32
    assert str(record["values"]["layout"]).count("{") < 7_000 / 2
    assert _same(state, decode(_over_the_wire(record)))


def _forged(base: dict, edit) -> object:
    record = encode(base)
    edit(record)
    return record


def test_a_record_not_written_as_the_codec_writes_its_payload_is_refused():
    """Every bit of a record is a function of its payload: a layout entry with a key of no use, an array under
    another name, a list of ints written item by item, other spacing, a negative length or an array with other
    metadata would each carry data the guard never sees, and each is refused."""
    base = {"w": torch.arange(4.0), "ids": [1, 2, 3], "tag": b"tt"}
    layout = encode(base)["values"]["layout"]

    def set_layout(text):
        def edit(r):
            r["values"]["layout"] = text

        return edit

    def rename_array(r):
        r["arrays"]["secret=ab"] = r["arrays"].pop("p/0")
        r["values"]["layout"] = r["values"]["layout"].replace('"p/0"', '"secret=ab"')

    def array_metadata(r):
        a = r["arrays"]["p/0"]
        r["arrays"]["p/0"] = Array(a.dtype, (2, 2), a.stype, a.data)  # the values as sent, another shape

    assert '"li": [1, 2, 3]' in layout and '{"b": 2}' in layout
    cases = {
        "key of no use": set_layout(layout.replace('{"b": 2}', '{"b": 2, "x": "secret"}')),
        "item by item": set_layout(layout.replace('{"li": [1, 2, 3]}', '{"l": [{"v": 1}, {"v": 2}, {"v": 3}]}')),
        "spacing": set_layout(layout.replace(", ", ",  ")),
        "negative length": set_layout(layout.replace('{"b": 2}', '{"b": -1}')),
        "renamed array": rename_array,
        "array metadata": array_metadata,
    }
    assert _same(base, decode(_over_the_wire(encode(base))))
    for edit in cases.values():
        with pytest.raises(CodecError):
            decode(_forged(base, edit))
