"""Payloads (nested dicts of tensors, arrays, bytes and scalars) to Flower ``RecordDict`` and back, exactly.

Tensors and NumPy arrays travel in one :class:`~flwr.app.ArrayRecord` (``"arrays"``); bytes, strings and numbers in
one :class:`~flwr.app.ConfigRecord` (``"values"``); the nesting, the Python types and the tensor dtypes in a JSON
``"layout"`` string inside that ConfigRecord. Decoding rebuilds the same structure with the same types, dtypes and
values (bf16 tensors travel as float32, which holds every bf16 value exactly; NumPy scalars arrive as Python
scalars). Nothing is pickled: a message cannot
make its receiver run code.
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


class CodecError(ValueError):
    """A payload holds a value the codec does not carry (say which key)."""


def encode(payload: dict[str, Any]) -> RecordDict:
    arrays: dict[str, Array] = {}
    values: dict[str, Any] = {}

    def walk(v: Any, path: str, where: str) -> Any:
        """``path``: the storage key (unique); ``where``: the key path a person reads in an error."""
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
            values[path] = v
            return {"b": path}
        if isinstance(v, dict):
            return {"d": [[walk(k, f"{path}/k{i}", f"{where} key"), walk(x, f"{path}/{i}", f"{where}.{k}")]
                          for i, (k, x) in enumerate(v.items())]}  # fmt: skip
        if isinstance(v, (list, tuple)):
            items = [walk(x, f"{path}/{i}", f"{where}[{i}]") for i, x in enumerate(v)]
            return {"l" if isinstance(v, list) else "u": items}
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            v = v.item()
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"v": v}
        raise CodecError(f"{where}: a {type(v).__name__} cannot travel in a message")

    layout = walk(dict(payload), "p", "payload")
    values["layout"] = json.dumps(layout, allow_nan=True)
    return RecordDict({"arrays": ArrayRecord(array_dict=arrays), "values": ConfigRecord(values)})


def decode(record: RecordDict, *, meta_keys: frozenset[str] | None = None) -> dict[str, Any]:
    """The payload of ``record``. Strict: a record that holds anything the layout does not name (another record,
    an unreferenced array or value, a ``meta`` key outside ``meta_keys`` when given) is refused, so nothing can
    ride along a message past the guard, which checks the decoded payload."""
    allowed = {"arrays", "values"} | ({"meta"} if meta_keys is not None else set())
    if set(record.keys()) - allowed or not {"arrays", "values"} <= set(record.keys()):
        raise CodecError(f"a message holds records {sorted(record.keys())}; expected {sorted(allowed)}")
    if meta_keys is not None and "meta" in record and set(record["meta"].keys()) - meta_keys:
        raise CodecError(f"a message's meta holds {sorted(set(record['meta'].keys()) - meta_keys)}")
    arrays, values = record["arrays"], record["values"]
    used_arrays: set[str] = set()
    used_values: set[str] = {"layout"}

    def build(node: dict) -> Any:
        if "t" in node:
            used_arrays.add(node["t"])
            a = torch.from_numpy(np.array(arrays[node["t"]].numpy(), copy=True).reshape(node["shape"]))
            return a.to(_DTYPES[node["dtype"]])
        if "n" in node:
            used_arrays.add(node["n"])
            return np.array(arrays[node["n"]].numpy(), copy=True).reshape(node["shape"])
        if "b" in node:
            used_values.add(node["b"])
            return bytes(values[node["b"]])
        if "d" in node:
            return {build(k): build(x) for k, x in node["d"]}
        if "l" in node:
            return [build(x) for x in node["l"]]
        if "u" in node:
            return tuple(build(x) for x in node["u"])
        if "rs" in node:
            if not (isinstance(node["rs"], list) and len(node["rs"]) == 3):
                raise CodecError("a row-sparse update is not (columns, values, shape)")
            cols, vals, shape = node["rs"]
            if not (isinstance(shape, list) and len(shape) == 2 and all(type(k) is int and k >= 0 for k in shape)):
                raise CodecError("a row-sparse update's shape is not two sizes")
            return RowSparseDelta(build(cols), build(vals), (shape[0], shape[1]))
        return node["v"]

    payload = build(json.loads(str(values["layout"])))
    extra = sorted((set(arrays.keys()) - used_arrays) | (set(values.keys()) - used_values))
    if extra:
        raise CodecError(f"a message carries entries its layout does not name: {extra[:5]}")
    if not isinstance(payload, dict):
        raise CodecError("a message's payload is not a mapping")
    return payload


__all__ = ["CodecError", "decode", "encode"]
