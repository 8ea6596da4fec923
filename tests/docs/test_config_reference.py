"""The config reference is generated from the pydantic schema (docs/hooks/config_reference.py); every key a user can
set, in the core's sections and the plugins', is in it, also inside unions of models (discriminated or not)."""

from __future__ import annotations

import importlib.util
import typing
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from tests.conftest import REPO
from tests.docs.pages import page

_spec = importlib.util.spec_from_file_location("config_reference", REPO / "docs" / "hooks" / "config_reference.py")
config_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(config_reference)


def _config_fields(model, prefix=""):
    """The dotted path of every field of a config model and of the models it nests (through unions too)."""
    for name, field in model.model_fields.items():
        yield prefix + name
        args = typing.get_args(field.annotation) or (field.annotation,)
        for arg in (*args, *(b for a in args for b in typing.get_args(a))):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _config_fields(arg, f"{prefix}{name}.")


def test_every_config_key_is_in_the_generated_reference():
    from secure_fed.config import ExperimentConfig
    from secure_fed.plugins import registry

    keys = set(config_reference.config_keys())
    assert set(registry("config_sections")) <= keys
    assert sorted(set(_config_fields(ExperimentConfig)) - keys) == []


def test_the_reference_page_holds_the_marker_the_hook_replaces():
    assert config_reference.MARKER in page("reference/config.md")
    rendered = config_reference.render()
    assert "| `privacy.instance.target_epsilon` |" in rendered and "### `secure_aggregation`" in rendered


class _Fed(BaseModel):
    name: Literal["fed"] = "fed"
    lam: float = Field(10.0, ge=0, description="the regulariser's weight")


class _Avg(BaseModel):
    name: Literal["avg"]
    momentum: float = 0.9


class _Root(BaseModel):
    algorithm: Annotated[_Fed | _Avg, Field(discriminator="name")] = _Fed()
    extra: _Avg | None = None


def test_a_discriminated_union_gets_a_table_per_variant(monkeypatch):
    monkeypatch.setattr(config_reference, "_schema", _Root.model_json_schema)
    assert (
        set(config_reference.config_keys())
        == set(_config_fields(_Root))
        == {
            "algorithm",
            "algorithm.name",
            "algorithm.lam",
            "algorithm.momentum",
            "extra",
            "extra.name",
            "extra.momentum",
        }
    )
    monkeypatch.setattr("secure_fed.plugins.registry", lambda group: {})
    rendered = config_reference.render()
    assert "### `algorithm` (`name: fed`)" in rendered and "### `algorithm` (`name: avg`)" in rendered
    assert "| `algorithm.lam` | number | `10.0` | ≥ 0 | the regulariser's weight |" in rendered
