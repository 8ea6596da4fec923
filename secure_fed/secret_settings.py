"""Settings whose value is a secret, declared by the field that holds it.

A config section (the core's or a plugin's) marks a field secret with ``Field(..., json_schema_extra=SECRET)``: a
seed that derives DP noise or a secure-aggregation graph, for instance. What a run releases (``secure-fed export``)
leaves every such field out, without the core naming any section: :func:`secret_paths` finds them by walking the
config model, unions (``algorithm``'s variants) and optional sections included.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

#: the marker: ``Field(None, json_schema_extra=SECRET)``
SECRET: dict[str, Any] = {"secret": True}


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X``, ``X | None``, ``Annotated[A | B, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
    return []


def secret_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every ``(section, ..., key)`` path of ``model`` whose field is marked :data:`SECRET`, in field order."""
    out: list[tuple[str, ...]] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        extra = info.json_schema_extra
        if isinstance(extra, dict) and extra.get("secret") is True:
            out.append((*prefix, key))
            continue
        for sub in _models_in(info.annotation):
            out.extend(p for p in secret_paths(sub, (*prefix, key)) if p not in out)
    return out


def without_secrets(doc: dict[str, Any], paths: list[tuple[str, ...]]) -> dict[str, Any]:
    """A copy of the config mapping ``doc`` less every path in ``paths`` (missing ones are fine)."""

    def strip(node: Any, rest: list[tuple[str, ...]]) -> Any:
        if not isinstance(node, dict):
            return node
        here = {p[0] for p in rest if len(p) == 1}
        return {k: strip(v, [p[1:] for p in rest if len(p) > 1 and p[0] == k]) for k, v in node.items() if k not in here}

    return strip(doc, paths)
