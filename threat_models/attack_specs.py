"""Where the ``secure_fed.attacks`` entry points of an older install point: ``threat_models.attack_specs:NAME``.

Each attack now owns its spec, in ``threat_models/attacks/<name>_spec.py`` (``SPEC``), and ``pyproject.toml``'s entry
points name that module. An editable install made before that still lists ``threat_models.attack_specs:<NAME>``; this
module resolves such a name, upper-cased, to the attack's own spec (``pip install -e .`` refreshes the entry points).
It names no attack.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if not name.isupper():
        raise AttributeError(name)
    try:
        module = importlib.import_module(f"threat_models.attacks.{name.lower()}_spec")
    except ModuleNotFoundError as e:
        if e.name != f"threat_models.attacks.{name.lower()}_spec":
            raise
        raise AttributeError(f"{__name__} has no attack spec {name} (no threat_models.attacks.{name.lower()}_spec)") from e
    return module.SPEC
