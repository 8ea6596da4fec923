"""The public plugin API for attacks and audits (threat_models/): the stable types and helpers they import from secure-fed.

A name is listed here because a plugin needs it; everything else in secure_fed is internal and may change. An attack
reads the run's settings from its :class:`RunPlan` (``plan.training.rounds``; its own section with
``plan.part(Model)``), never from the config object; to load a config (or a variant of one) it calls
:func:`secure_fed.config.load_plan` or :func:`plan_variant` here.

Every name is imported when first read (a module ``__getattr__``, as :mod:`secure_fed.plugin_api`), so importing this
module loads neither torch nor the engine: an attack's light spec (``<name>_spec.py``) imports from here too.

The helpers at the bottom are the stable way to build or re-run a run from a plan (:func:`build_experiment`,
:func:`run_cached`, …): an attack that trains shadow models or re-runs a variant calls them instead of reaching the
engine.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from secure_fed.algorithms.base import ClientFn
    from secure_fed.algorithms.batched_sgd import group_key, linear_chain, train_group
    from secure_fed.algorithms.client import full_label_targets
    from secure_fed.algorithms.label_sets import Sha256Tokenizer
    from secure_fed.algorithms.losses import LOSSES
    from secure_fed.algorithms.registry import algorithm_specs
    from secure_fed.data import Features, MultiLabelDataset, MultiLabelSplit, stack_rows
    from secure_fed.engine import Experiment
    from secure_fed.engine.callbacks import Callback
    from secure_fed.engine.checkpoints import load_checkpoint_file
    from secure_fed.engine.collector import long_lived_frozen
    from secure_fed.engine.vectorized import VectorizedExecutor
    from secure_fed.errors import ConfigError, SecureFedError, unknown_name
    from secure_fed.html_report import has_operator_columns, html_report, released, run_row, write_csv
    from secure_fed.io import check_writable_dir
    from secure_fed.memory import DataShape
    from secure_fed.metrics import evaluate_scores
    from secure_fed.models.preprocess import IMAGENET_MEAN, IMAGENET_STD
    from secure_fed.models.sparse_rows import dense_delta, split_rows
    from secure_fed.plan import RunPlan
    from secure_fed.plugin_specs import AttackSpec, attack_specs
    from secure_fed.progress import phase, track
    from secure_fed.release import protected, public, release_fields
    from secure_fed.run_files import (
        ATTACKS_RECORD,
        PRIVATE_DIR,
        attacks_path,
        checkpoint_dir,
        operator_config_path,
        stamp_released,
    )
    from secure_fed.run_status import trained

#: each name → the module it is read from on first use ("module:attribute" where the name differs)
_LAZY = {
    # -- the plan and the registry: what an attack's spec declares and reads
    "RunPlan": "secure_fed.plan",  # a run's resolved settings (core parts by name, plugin sections with .part())
    "AttackSpec": "secure_fed.plugin_specs",  # an attack's registration (its SPEC, under secure_fed.attacks)
    "attack_specs": "secure_fed.plugin_specs",  # name → AttackSpec of every registered attack
    "algorithm_specs": "secure_fed.algorithms.registry",  # name → AlgorithmSpec of every registered algorithm
    "DataShape": "secure_fed.memory",  # the data's sizes an AttackSpec.memory(shape, plan) estimate reads
    # -- errors: a SecureFedError is one ``error:`` line (exit 2) at the command line
    "SecureFedError": "secure_fed.errors",  # a user-facing error
    "ConfigError": "secure_fed.errors",  # a config that does not validate (load_plan raises it)
    "unknown_name": "secure_fed.errors",  # the one line for an unknown name, with the close matches
    # -- a run directory's files
    "ATTACKS_RECORD": "secure_fed.run_files",  # the key of attacks.json that holds the results
    "PRIVATE_DIR": "secure_fed.run_files",  # the operator-only folder of a run directory
    "attacks_path": "secure_fed.run_files",  # a run's private/attacks.json
    "checkpoint_dir": "secure_fed.run_files",  # a run's private/checkpoints/
    "operator_config_path": "secure_fed.run_files",  # a run's private/config.yaml (the whole config, secrets included)
    "stamp_released": "secure_fed.run_files",  # set a released folder's files to the fixed release time
    "trained": "secure_fed.run_status",  # a summary status after which the model was trained
    "check_writable_dir": "secure_fed.io",  # an output folder's check (one error line when it cannot be written)
    "load_checkpoint_file": "secure_fed.engine.checkpoints",  # read one checkpoint file (torch)
    # -- progress on stderr
    "phase": "secure_fed.progress",  # a named phase with a heartbeat line
    "track": "secure_fed.progress",  # an iterable with progress lines
    # -- instrumenting a run
    "Experiment": "secure_fed.engine",  # a run (build one with build_experiment; .run(), .resume(), .theta, …)
    "Callback": "secure_fed.engine.callbacks",  # the base class of the attack taps (hooks into the round loop)
    "ClientFn": "secure_fed.algorithms.base",  # a client's training function (what a client_mod wraps)
    # -- data, models and scores
    "Features": "secure_fed.data",  # a feature matrix (dense or sparse rows)
    "stack_rows": "secure_fed.data",  # stack feature rows into one matrix
    "MultiLabelDataset": "secure_fed.data",  # a loaded dataset (train and test splits, label names)
    "MultiLabelSplit": "secure_fed.data",  # one split of a dataset (features, labels)
    "dense_delta": "secure_fed.models.sparse_rows",  # an update's row-sparse entries as dense tensors
    "split_rows": "secure_fed.models.sparse_rows",  # a row-sparse update's (rows, values)
    "full_label_targets": "secure_fed.algorithms.client",  # the multi-hot targets a client's loss reads
    "LOSSES": "secure_fed.algorithms.losses",  # the algorithms' loss functions by name
    "Sha256Tokenizer": "secure_fed.algorithms.label_sets",  # the unkeyed label-set tokenizer
    "IMAGENET_MEAN": "secure_fed.models.preprocess",  # the image normalisation's mean
    "IMAGENET_STD": "secure_fed.models.preprocess",  # the image normalisation's standard deviation
    "evaluate_scores": "secure_fed.metrics",  # the run's metrics (P@k, mAP, …) of scores against labels
    # -- batched shadow training (threat_models.shadow_cohort: many shadow runs trained as one vectorised cohort)
    "VectorizedExecutor": "secure_fed.engine.vectorized",  # the executor that trains a chunk of clients together
    "group_key": "secure_fed.algorithms.batched_sgd",  # which clients' local training can be batched together
    "linear_chain": "secure_fed.algorithms.batched_sgd",  # a model as a chain of linear layers (batched SGD)
    "train_group": "secure_fed.algorithms.batched_sgd",  # batched local SGD of a group of clients
    "long_lived_frozen": "secure_fed.engine.collector",  # freeze long-lived objects out of the garbage collector
    # -- released reports and their gate (secure-fed tradeoff)
    "run_row": "secure_fed.html_report",  # one run's row of a study's results
    "released": "secure_fed.html_report",  # a row without its operator-only columns
    "has_operator_columns": "secure_fed.html_report",  # whether rows hold operator-only columns
    "html_report": "secure_fed.html_report",  # a study's report.html
    "write_csv": "secure_fed.html_report",  # a study's results.csv
    "protected": "secure_fed.release",  # tag a released value as DP-protected
    "public": "secure_fed.release",  # tag a released value as a public fact
    "release_fields": "secure_fed.release",  # check a released record's tags (the release gate)
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, _, attr = _LAZY[name].partition(":")
        return getattr(importlib.import_module(module), attr or name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------- stable helpers
def plan_variant(plan: RunPlan, overrides: list[str]) -> RunPlan:
    """``plan`` with ``overrides`` applied (``key=value``, as ``--set``), validated and resolved again: a variant of a
    run (a shadow run, a re-run without a layer). A bad override raises :class:`ConfigError` (one line)."""
    import yaml

    from secure_fed.config import load_plan

    return load_plan(yaml.safe_load(plan.config_yaml), list(overrides))


def build_experiment(plan: RunPlan, *, run_dir: str | Path, data_root: str | None = None, dataset: Any = None,
                     callbacks: Any = ()) -> Experiment:  # fmt: skip
    """The run ``plan`` describes, built in ``run_dir`` and not trained: ``.run()`` trains it, ``.resume()`` loads its
    last checkpoint. ``dataset`` (a :class:`MultiLabelDataset`) replaces the configured data (shadow runs);
    ``callbacks``: the caller's own, beside the registered ones."""
    from secure_fed.engine import Experiment

    return Experiment(plan, run_dir=run_dir, data_root=data_root, dataset=dataset, callbacks=callbacks)


def run_cached(plan: RunPlan, run_dir: str | Path, *, data_root: str | None = None, progress: bool = False) -> dict[str, Any]:
    """Run ``plan`` in ``run_dir`` and return its summary, unless a finished run of the same settings is there
    (returned as is); an unfinished one is resumed. A run of other settings there raises :class:`SecureFedError`."""
    from secure_fed.sweep import run_cached as _run_cached

    return _run_cached(plan, run_dir, data_root=data_root, progress=progress)


def cached_summary(plan: RunPlan, run_dir: str | Path) -> dict[str, Any] | None:
    """The summary of a finished run of exactly ``plan`` in ``run_dir``, None if there is none yet; a run of other
    settings there raises :class:`SecureFedError`."""
    from secure_fed.sweep import cached_summary as _cached_summary

    return _cached_summary(plan, run_dir)


def build_model(plan: RunPlan, dataset: MultiLabelDataset, *, cache_dir: str | Path | None = None) -> torch.nn.Module:
    """θ's module as ``plan`` builds it for ``dataset`` (the same arguments always build the same module: θ⁰ is
    public, it follows from the seed)."""
    from secure_fed.engine.builders import build_model as _build_model

    return _build_model(plan, dataset, cache_dir=cache_dir)


def build_dataset(plan: RunPlan, data_root: str | None = None) -> MultiLabelDataset:
    """The data ``plan`` configures, loaded (from ``data_root``, else the data folder's default)."""
    from secure_fed.data.from_config import build_dataset as _build_dataset

    return _build_dataset(plan, data_root)


def parse_seeds(text: str) -> list[int]:
    """``--seeds 0,1,2`` as the command line reads it (one error line for a bad list)."""
    from secure_fed.cli import _parse_seeds

    return _parse_seeds(text)


__all__ = [
    "RunPlan",
    "AttackSpec",
    "attack_specs",
    "algorithm_specs",
    "DataShape",
    "SecureFedError",
    "ConfigError",
    "unknown_name",
    "ATTACKS_RECORD",
    "PRIVATE_DIR",
    "attacks_path",
    "checkpoint_dir",
    "operator_config_path",
    "stamp_released",
    "trained",
    "check_writable_dir",
    "load_checkpoint_file",
    "phase",
    "track",
    "Experiment",
    "Callback",
    "ClientFn",
    "Features",
    "stack_rows",
    "MultiLabelDataset",
    "MultiLabelSplit",
    "dense_delta",
    "split_rows",
    "full_label_targets",
    "LOSSES",
    "Sha256Tokenizer",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "evaluate_scores",
    "VectorizedExecutor",
    "group_key",
    "linear_chain",
    "train_group",
    "long_lived_frozen",
    "run_row",
    "released",
    "has_operator_columns",
    "html_report",
    "write_csv",
    "protected",
    "public",
    "release_fields",
    "plan_variant",
    "build_experiment",
    "run_cached",
    "cached_summary",
    "build_model",
    "build_dataset",
    "parse_seeds",
]
