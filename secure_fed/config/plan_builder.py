"""The one place a validated config becomes a :class:`~secure_fed.plan.RunPlan`: :func:`build_plan`.

Each core section is copied into its frozen plan dataclass (lists become tuples, nested sections nested plans) and its
``auto`` choices that the config alone decides are resolved here (``dataset.drop_empty_labels``,
``model.ctran.dropout``, ``training.sparse_updates``; those the loaded data or the machine decide are resolved once
when the run is built, :func:`secure_fed.model_choices.resolve_run_choices`); each plugin section and the algorithm's parameters
are deep-copied and frozen, so the plan shares no object with the config.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from functools import cache
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel

from secure_fed import plan as P

#: core section name -> its plan dataclass
_CORE = {
    "dataset": P.DatasetPlan,
    "partition": P.PartitionPlan,
    "model": P.ModelPlan,
    "training": P.TrainingPlan,
    "evaluation": P.EvaluationPlan,
    "output": P.OutputPlan,
    "flower": P.FlowerPlan,
}
#: nested core sections: (parent plan class, field) -> plan dataclass
_NESTED = {
    "synthetic": P.SyntheticPlan,
    "mosaics": P.MosaicsPlan,
    "ctran": P.CTranPlan,
    "server_optimizer": P.ServerOptimizerPlan,
}


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    return value


def _copy(kind: type, section: BaseModel, **resolved: Any) -> Any:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(kind):
        if f.name in resolved:
            values[f.name] = resolved[f.name]
            continue
        v = getattr(section, f.name)
        values[f.name] = _copy(_NESTED[f.name], v) if f.name in _NESTED else _plain(v)
    return kind(**values)


@cache
def _frozen_class(kind: type[BaseModel]) -> type[BaseModel]:
    """``kind`` with assignment refused: a subclass, so ``isinstance`` and ``plan.part(kind)`` still hold. It is
    bound in ``kind``'s module as ``Frozen<name>``, so a plan pickles (a process pool's workers receive plans)."""
    name = f"Frozen{kind.__name__}"
    frozen = type(name, (kind,), {"model_config": {**kind.model_config, "frozen": True}, "__module__": kind.__module__})
    setattr(sys.modules[kind.__module__], name, frozen)
    return frozen


def _frozen_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _frozen(value)
    if isinstance(value, list | tuple):
        return tuple(_frozen_value(v) for v in value)
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen_value(v) for k, v in value.items()})
    return copy.deepcopy(value)


def _frozen(model: BaseModel) -> BaseModel:
    """A deep copy of ``model`` (nested models too) that refuses assignment; lists become tuples, dicts read-only."""
    values = {name: _frozen_value(getattr(model, name)) for name in type(model).model_fields}
    return _frozen_class(type(model)).model_construct(_fields_set=set(model.model_fields_set), **values)


#: the config's core keys that are plan fields of their own (the rest of RunPlan's fields are the sections above)
_CORE_KEYS = ("seed", "device", "backend", "protocols", "algorithm")


def dump_config(cfg: BaseModel) -> str:
    """A validated config as YAML (what ``config.yaml`` records, and :attr:`~secure_fed.plan.RunPlan.config_yaml`)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def build_plan(cfg: BaseModel) -> P.RunPlan:
    """The plan of a validated config (a :class:`~secure_fed.config.schema.CoreConfig`, the schema's model with its
    plugin sections; see the module docstring). This module imports neither the schema nor the loader, which call it
    (the schema validates the stack on the plan), so the config package has no import circle."""
    dp = "dp" in cfg.protocols
    ds = cfg.dataset
    drop = (not dp) if ds.drop_empty_labels == "auto" else bool(ds.drop_empty_labels)
    ctran = cfg.model.ctran
    ctran_plan = _copy(P.CTranPlan, ctran, dropout=ctran.dropout_rate, dropout_auto=ctran.dropout == "auto")
    parts = {
        "dataset": _copy(P.DatasetPlan, ds, drop_empty_labels=drop),
        "partition": _copy(P.PartitionPlan, cfg.partition),
        "model": _copy(P.ModelPlan, cfg.model, ctran=ctran_plan),
        "training": _copy(
            P.TrainingPlan, cfg.training, threads_auto=cfg.training.threads == "auto", threads_why="training.threads"
        ),
        "evaluation": _copy(P.EvaluationPlan, cfg.evaluation),
        "output": _copy(P.OutputPlan, cfg.output),
        "flower": _copy(P.FlowerPlan, cfg.flower),
    }
    core = {*_CORE, *_CORE_KEYS}
    sections = {name: _frozen(getattr(cfg, name)) for name in type(cfg).model_fields if name not in core}
    plan = P.RunPlan(
        seed=cfg.seed,
        device=cfg.device,
        backend=cfg.backend,
        protocols=tuple(cfg.protocols),
        algorithm=_frozen(cfg.algorithm),
        sections=sections,
        config_yaml=dump_config(cfg),
        **parts,
    )
    return _resolve_sparse_updates(plan)


def _resolve_sparse_updates(plan: P.RunPlan) -> P.RunPlan:
    """``training.sparse_updates: auto``: true where every listed layer takes row-sparse θ updates
    (:func:`~secure_fed.plugin_specs.dense_update_layers` names none), else false; an explicit value stays (true with
    such a layer is refused by the stack's validation). Whether the run's rows are sparse is the data's part, decided
    when the run is built: a row-sparse update needs both."""
    if plan.training.sparse_updates != "auto":
        return plan
    from secure_fed.plugin_specs import dense_update_layers  # local: the layers' specs load the plugins

    sparse = not dense_update_layers(plan)
    return dataclasses.replace(plan, training=dataclasses.replace(plan.training, sparse_updates=sparse))
