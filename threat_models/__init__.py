"""Attack simulators and privacy audits: what each protocol layer protects, measured.

Each attack owns its module (``threat_models/attacks/<name>.py``) and its light spec (``<name>_spec.py``: the
metadata, its settings section ``attacks.<name>:``, what it records during training, its headline); ``secure-fed
list`` lists the registered ones with the role each takes and what it measures.

Each attack sees only its role's view (:mod:`threat_models.views`); see
:mod:`threat_models.base` for the interface and :func:`threat_models.audit.audit`
for the harness; the core finds attacks through the ``secure_fed.attacks`` entry points
(each attack's ``SPEC``). In YAML: ``attacks: {run: [all]}``; on a finished run:
``secure-fed audit RUN_DIR``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """Loaded on first use, so that finding an attack's spec imports no attack (and no torch)."""
    if name == "ATTACKS":  # name → attack class, for every registered attack (secure_fed.attacks entry points)
        from secure_fed.plugin_api.attacks import attack_specs

        return {n: spec.load() for n, spec in attack_specs().items()}
    if name in ("Attack", "AttackResult", "Role"):
        from threat_models import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["ATTACKS", "Attack", "AttackResult", "Role"]
