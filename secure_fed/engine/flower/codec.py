"""Payloads (nested dicts of tensors, arrays, bytes and scalars) to Flower ``RecordDict`` and back, exactly.

Tensors and NumPy arrays travel in one :class:`~flwr.app.ArrayRecord` (``"arrays"``); one
:class:`~flwr.app.ConfigRecord` (``"values"``) holds a JSON ``"layout"`` string (the nesting, the Python types, the
scalars, the tensor dtypes) and every bytes value of the payload, concatenated in the layout's order, as one
``"bytes"`` value (the layout gives each one's length). A list or tuple whose items are all ints, or all bytes, is one
layout entry, and a dict is its keys and its values as two lists, so a payload of many small secrets (a node's
SecAgg+ state: 120,000 32-byte values and 250,000 ints) is a few thousand layout entries and two ConfigRecord values,
not one entry per value. Decoding rebuilds the same structure with the same types, dtypes and values (bf16 tensors
travel as float32, which holds every bf16 value exactly; NumPy scalars arrive as Python scalars). Nothing is
pickled: a message cannot make its receiver run code.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from secure_fed.models.sparse_rows import RowSparseDelta

_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                               torch.int16, torch.int8, torch.uint8, torch.bool)}  # fmt: skip
#: the ConfigRecord values of an encoded payload: its layout and its bytes values, concatenated
_VALUE_KEYS = frozenset({"layout", "bytes"})


class CodecError(ValueError):
    """A payload holds a value the codec does not carry (say which key)."""


def _all_ints(items: list | tuple) -> bool:
    return bool(items) and all(type(x) is int for x in items)


def _all_bytes(items: list | tuple) -> bool:
    return bool(items) and all(type(x) is bytes for x in items)


def encode(payload: dict[str, Any]) -> RecordDict:
    arrays: dict[str, Array] = {}
    blob: list[bytes] = []

    def walk(v: Any, path: str, where: str) -> Any:
        """``path``: the storage key of an array (unique); ``where``: the key path a person reads in an error."""
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu()
            dtype = str(t.dtype)
            if dtype not in _DTYPES:
                raise CodecError(f"{where}: tensors of dtype {dtype} are not carried")
            host = t.float() if t.dtype == torch.bfloat16 else t
            arrays[path] = Array(np.ascontiguousarray(host.numpy()).reshape(-1))
            return {"t": path, "dtype": dtype, "shape": list(t.shape)}
        if isinstance(v, RowSparseDelta):  # a sparse-input table's update as its touched columns
            return {"rs": [walk(v.cols, f"{path}/c", f"{where}.cols"), walk(v.values, f"{path}/v", f"{where}.values"),
                           list(v.shape)]}  # fmt: skip
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in "biuf":
                raise CodecError(f"{where}: arrays of dtype {v.dtype} are not carried")
            arrays[path] = Array(np.ascontiguousarray(v).reshape(-1))
            return {"n": path, "shape": list(v.shape)}
        if isinstance(v, bytes):
            b = bytes(v)
            blob.append(b)
            return {"b": len(b)}
        if isinstance(v, dict):
            keys, items = list(v.keys()), list(v.values())
            return {"d": [walk(keys, f"{path}/k", f"{where} key"), walk_items(items, path, where, [str(k) for k in keys])]}
        if isinstance(v, (list, tuple)):
            return walk_items(v, path, where, None)
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            v = v.item()
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"v": v}
        raise CodecError(f"{where}: a {type(v).__name__} cannot travel in a message")

    def walk_items(v: list | tuple, path: str, where: str, names: list[str] | None) -> Any:
        tag = "l" if isinstance(v, list) else "u"
        if _all_ints(v):  # one JSON list of ints (bools, which are ints too, take the general form)
            return {tag + "i": list(v)}
        if _all_bytes(v):
            parts = [bytes(x) for x in v]
            blob.extend(parts)
            return {tag + "b": [len(x) for x in parts]}
        return {tag: [walk(x, f"{path}/{i}", f"{where}.{names[i]}" if names else f"{where}[{i}]")
                      for i, x in enumerate(v)]}  # fmt: skip

    layout = walk(dict(payload), "p", "payload")
    values = {"layout": json.dumps(layout, allow_nan=True), "bytes": b"".join(blob)}
    return RecordDict({"arrays": ArrayRecord(array_dict=arrays), "values": ConfigRecord(values)})


#: the keys of each kind of layout entry (an entry with any other key set is refused)
_ENTRY_KEYS = {frozenset(k) for k in (("t", "dtype", "shape"), ("n", "shape"), ("b",), ("d",), ("l",), ("u",), ("li",),
                                      ("ui",), ("lb",), ("ub",), ("rs",), ("v",))}  # fmt: skip


def decode(record: RecordDict, *, meta_keys: frozenset[str] | None = None) -> dict[str, Any]:
    """The payload of ``record``. Strict: a record that holds anything the layout does not name (another record,
    an unreferenced array or value, bytes past the last one the layout names, a ``meta`` key outside ``meta_keys``
    when given) is refused, and so is a layout that is not the one :func:`encode` writes for the payload it
    describes (an entry with a key of no use, an array under another name, other spacing or key order), so nothing
    can ride along a message past the guard, which checks the decoded payload."""
    allowed = {"arrays", "values"} | ({"meta"} if meta_keys is not None else set())
    if set(record.keys()) - allowed or not {"arrays", "values"} <= set(record.keys()):
        raise CodecError(f"a message holds records {sorted(record.keys())}; expected {sorted(allowed)}")
    if meta_keys is not None and "meta" in record and set(record["meta"].keys()) - meta_keys:
        raise CodecError(f"a message's meta holds {sorted(set(record['meta'].keys()) - meta_keys)}")
    arrays, values = record["arrays"], record["values"]
    if set(values.keys()) != _VALUE_KEYS:
        raise CodecError(f"a message's values are {sorted(values.keys())[:5]}; expected {sorted(_VALUE_KEYS)}")
    blob, text = values["bytes"], values["layout"]
    if not isinstance(blob, bytes) or not isinstance(text, str):
        raise CodecError("a message's layout is not a string or its bytes value is not bytes")
    cursor = 0
    used_arrays: set[str] = set()

    def take(n: Any) -> bytes:
        nonlocal cursor
        if type(n) is not int or n < 0 or cursor + n > len(blob):
            raise CodecError("a message's layout names bytes it does not carry")
        cursor += n
        return blob[cursor - n : cursor]

    def ints(xs: Any) -> list:
        if not (isinstance(xs, list) and xs and all(type(x) is int for x in xs)):
            raise CodecError("a message's list of ints holds something else")
        return xs

    def lengths(xs: Any) -> list:
        if not (isinstance(xs, list) and xs):
            raise CodecError("a message's list of bytes is not a list of lengths")
        return [take(n) for n in xs]

    def array(node: dict, path: str) -> np.ndarray:
        name = node["t"] if "t" in node else node["n"]
        shape = node["shape"]
        if name != path or name not in arrays.keys():
            raise CodecError(f"a message's layout names an array {str(name)[:40]!r} it does not carry at {path}")
        if not (isinstance(shape, list) and all(type(k) is int and k >= 0 for k in shape)):
            raise CodecError("a message's array shape is not a list of sizes")
        used_arrays.add(name)
        try:
            return np.array(arrays[name].numpy(), copy=True).reshape(shape)
        except (TypeError, ValueError) as e:
            raise CodecError(f"a message's array at {path} cannot be read: {str(e)[:80]}") from None

    def build(node: Any, path: str) -> Any:
        if not isinstance(node, dict) or frozenset(node) not in _ENTRY_KEYS:
            raise CodecError(f"a message's layout holds an entry of no known kind at {path}")
        if "t" in node:
            if node["dtype"] not in _DTYPES:
                raise CodecError(f"a message's tensor at {path} has dtype {str(node['dtype'])[:20]!r}")
            return torch.from_numpy(array(node, path)).to(_DTYPES[node["dtype"]])
        if "n" in node:
            return array(node, path)
        if "b" in node:
            return take(node["b"])
        if "d" in node:
            if not (isinstance(node["d"], list) and len(node["d"]) == 2):
                raise CodecError("a message's mapping is not (keys, values)")
            keys, items = build(node["d"][0], f"{path}/k"), sequence(node["d"][1], path)
            if not (isinstance(keys, list) and isinstance(items, list) and len(keys) == len(items)):
                raise CodecError("a message's mapping has not one value per key")
            try:
                out = dict(zip(keys, items, strict=True))
            except TypeError as e:  # an unhashable key
                raise CodecError(f"a message's mapping has a key that cannot be one: {e}") from None
            if len(out) != len(keys):
                raise CodecError("a message's mapping names a key twice")
            return out
        if "rs" in node:
            if not (isinstance(node["rs"], list) and len(node["rs"]) == 3):
                raise CodecError("a row-sparse update is not (columns, values, shape)")
            cols, vals, shape = node["rs"]
            if not (isinstance(shape, list) and len(shape) == 2 and all(type(k) is int and k >= 0 for k in shape)):
                raise CodecError("a row-sparse update's shape is not two sizes")
            if not (isinstance(cols, dict) and "t" in cols and isinstance(vals, dict) and "t" in vals):
                raise CodecError("a row-sparse update's columns and values are not tensors")
            return RowSparseDelta(build(cols, f"{path}/c"), build(vals, f"{path}/v"), (shape[0], shape[1]))
        if "v" in node:
            v = node["v"]
            if not (v is None or isinstance(v, (bool, int, float, str))):
                raise CodecError(f"a message's scalar at {path} is a {type(v).__name__}")
            return v
        return sequence(node, path)

    def sequence(node: Any, path: str) -> list | tuple:
        """A list or tuple entry (``l``, ``u``, ``li``, ``ui``, ``lb``, ``ub``); its items' paths are ``path/i``."""
        if not isinstance(node, dict) or frozenset(node) not in _ENTRY_KEYS:
            raise CodecError(f"a message's layout holds an entry of no known kind at {path}")
        kind = next(iter(node))
        if kind in ("l", "u"):
            if not isinstance(node[kind], list):
                raise CodecError(f"a message's sequence at {path} is not a list")
            items = [build(x, f"{path}/{i}") for i, x in enumerate(node[kind])]
            return items if kind == "l" else tuple(items)
        if kind in ("li", "ui"):
            return list(ints(node[kind])) if kind == "li" else tuple(ints(node[kind]))
        if kind in ("lb", "ub"):
            return lengths(node[kind]) if kind == "lb" else tuple(lengths(node[kind]))
        raise CodecError(f"a message's layout holds a {kind!r} entry where a sequence belongs, at {path}")

    try:
        layout = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CodecError(f"a message's layout is not JSON: {str(e)[:80]}") from None
    payload = build(layout, "p")
    extra = sorted(set(arrays.keys()) - used_arrays)
    if extra:
        raise CodecError(f"a message carries entries its layout does not name: {extra[:5]}")
    if cursor != len(blob):
        raise CodecError(f"a message carries {len(blob) - cursor} bytes its layout does not name")
    if not isinstance(payload, dict):
        raise CodecError("a message's payload is not a mapping")
    _check_canonical(record, payload)
    return payload


def _npy_header(data: bytes) -> bytes:
    """The ``.npy`` header an :class:`~flwr.app.Array`'s bytes start with (its format version, dtype and shape)."""
    if len(data) < 12 or data[:6] != b"\x93NUMPY":
        raise CodecError("a message's array is not in the .npy format")
    size = int.from_bytes(data[8:10], "little") + 10 if data[6] == 1 else int.from_bytes(data[8:12], "little") + 12
    return data[:size]


def _check_canonical(record: RecordDict, payload: dict) -> None:
    """``record`` is what :func:`encode` writes for ``payload``: the same layout string and bytes, and each array
    with the same dtype, shape, type name and ``.npy`` header (its values are the payload's). A sender's every other
    choice (a key of no use, another list form, spacing, an array's metadata) would be a channel past the guard."""
    again = encode(payload)
    if again["values"]["layout"] != record["values"]["layout"] or again["values"]["bytes"] != record["values"]["bytes"]:
        raise CodecError("a message's layout is not the one the codec writes for its payload")
    arrays = record["arrays"]
    for name, b in again["arrays"].items():
        a = arrays[name]
        if (a.dtype, list(a.shape), a.stype, len(a.data)) != (b.dtype, list(b.shape), b.stype, len(b.data)) or (
            _npy_header(a.data) != _npy_header(b.data)
        ):
            raise CodecError(f"a message's array {name} is not stored as the codec stores it")


__all__ = ["CodecError", "decode", "encode"]
