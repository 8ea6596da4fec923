"""Experiment configuration: schema, loading, overrides."""

from secure_fed.config.loader import (
    apply_overrides,
    check_override_syntax,
    config_secret_paths,
    default_config_text,
    dump_config,
    first_difference,
    load_config,
    load_plan,
    raw_config,
)
from secure_fed.config.plan_builder import build_plan
from secure_fed.config.schema import AlgorithmConfig, ExperimentConfig

__all__ = [
    "AlgorithmConfig",
    "ExperimentConfig",
    "apply_overrides",
    "build_plan",
    "check_override_syntax",
    "config_secret_paths",
    "default_config_text",
    "dump_config",
    "first_difference",
    "load_config",
    "load_plan",
    "raw_config",
]
