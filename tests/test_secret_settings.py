"""Secret settings are declared by their fields (``secure_fed/secret_settings.py``) and left out of what a run
exports, whichever section (the core's or a plugin's) holds them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from secure_fed.config.schema import experiment_config_model
from secure_fed.export import public_config
from secure_fed.secret_settings import SECRET, secret_paths, without_secrets


class _Inner(BaseModel):
    key_seed: int | None = Field(None, json_schema_extra=SECRET)
    width: int = 3


class _A(BaseModel):
    name: Literal["a"] = "a"
    a_seed: int = Field(0, json_schema_extra=SECRET)


class _B(BaseModel):
    name: Literal["b"] = "b"
    inner: _Inner = _Inner()


class _Top(BaseModel):
    seed: int = 0
    section: _Inner | None = None
    choice: Annotated[_A | _B, Field(discriminator="name")] = _A()


def test_marked_fields_are_found_in_optional_sections_and_in_every_union_variant():
    assert secret_paths(_Top) == [("section", "key_seed"), ("choice", "a_seed"), ("choice", "inner", "key_seed")]


def test_the_built_in_secret_seeds_are_declared_by_their_sections():
    paths = secret_paths(experiment_config_model())
    assert ("privacy", "noise_seed") in paths and ("secure_aggregation", "graph_seed") in paths
    assert ("seed",) not in paths  # the run's public seed stays in the exported config


def test_the_public_config_drops_exactly_the_secret_settings():
    doc = {
        "seed": 3,
        "privacy": {"noise_seed": 7, "delta": 1e-5},
        "secure_aggregation": {"graph_seed": 11, "neighbors": "auto"},
        "ckks": None,
    }
    assert public_config(doc) == {
        "seed": 3,
        "privacy": {"delta": 1e-5},
        "secure_aggregation": {"neighbors": "auto"},
        "ckks": None,
    }
    assert doc["privacy"]["noise_seed"] == 7  # the caller's mapping is not changed
    assert without_secrets({"choice": {"inner": {"key_seed": 1, "width": 2}}}, [("choice", "inner", "key_seed")]) == {
        "choice": {"inner": {"width": 2}}
    }
