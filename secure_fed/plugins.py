"""Plugin registries: how the core finds the layers above it without importing them.

Packages declare Python entry points in their ``pyproject.toml`` (the pytest / flake8 plugin pattern);
the core reads them here, by group, and never names a module above it. The groups:

=================================  =====================================================================
``secure_fed.layers``              a :class:`~secure_fed.engine.layers.LayerSpec` per protocol layer
``secure_fed.attacks``             an attack spec per attack: name, role, description, its settings section,
                                   what it records during training, its headline
``secure_fed.config_sections``     a pydantic model per top-level YAML section a plugin owns
``secure_fed.callbacks``           ``factory(plan) -> Callback | None``, called for every run
``secure_fed.commands``            ``register(subparsers)``: extra ``secure-fed`` sub-commands
``secure_fed.model_families``      a :class:`~secure_fed.models.families.ModelFamily` subclass per model family
``secure_fed.algorithms``          an :class:`~secure_fed.algorithms.spec.AlgorithmSpec` per algorithm (its params
                                   model and capabilities; :mod:`secure_fed.algorithms.registry`)
``secure_fed.mechanisms``          a DP mechanism plugin's spec (``protocols.dp.mechanism_plugins``): its
                                   ``privacy.<name>:`` section, its client side, its sensitivities
=================================  =====================================================================

Specs and config sections must be light (pydantic and the standard library only), so that
``secure-fed validate`` and ``secure-fed list`` never import torch; a spec names its heavy
implementation as a ``"module:attr"`` string that :func:`load_object` imports when a run needs it.

A third party adds a layer by declaring, in its own ``pyproject.toml``::

    [project.entry-points."secure_fed.layers"]
    my_layer = "my_package.specs:MY_LAYER_SPEC"

The package's own plugins (the built-in algorithms, layers, attacks, mechanisms) are its ``pyproject.toml``'s entry
points and nothing else: where the package is imported from a source tree (a checkout on ``PYTHONPATH``, an editable
install), that tree's ``pyproject.toml`` is read too (:func:`source_entry_points`), so an entry point added there is
found before ``pip install -e .`` records it; an installed wheel has no such file and its metadata holds them all.
"""

from __future__ import annotations

import importlib
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

#: the source tree's ``pyproject.toml`` when ``secure_fed`` is imported from one (None: an installed package)
SOURCE_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

GROUPS = ("layers", "attacks", "config_sections", "callbacks", "commands", "model_families", "algorithms", "mechanisms")


@cache
def registry(group: str) -> dict[str, Any]:
    """Name → loaded object of every entry point in ``secure_fed.<group>``, in name order."""
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}; groups: {', '.join(GROUPS)}")
    found = {ep.name: ep for ep in entry_points(group=f"secure_fed.{group}")}
    for name, value in source_entry_points(group).items():  # the source tree's: they win over a stale install's
        found[name] = EntryPoint(name, value, f"secure_fed.{group}")
    return {name: found[name].load() for name in sorted(found)}


@cache
def source_entry_points(group: str) -> dict[str, str]:
    """``name → "module:attr"`` of the ``secure_fed.<group>`` entry points in the source tree's ``pyproject.toml``
    (this package's own, when it is imported from a source tree whose project is secure-fed), else ``{}``."""
    if not SOURCE_PYPROJECT.is_file():
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10: the installed metadata only
        return {}
    project = tomllib.loads(SOURCE_PYPROJECT.read_text(encoding="utf-8")).get("project", {})
    if project.get("name") != "secure-fed":
        return {}
    return dict(project.get("entry-points", {}).get(f"secure_fed.{group}", {}))


def load_object(path: str) -> Any:
    """Import ``"package.module:attr"`` (the heavy half of a plugin, loaded only when a run needs it)."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj
