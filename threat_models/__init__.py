"""Attack simulators and privacy audits: what each protocol layer protects, measured.

=========================  ========  ==========================================================
attack                     role      measures
=========================  ========  ==========================================================
``token_linkage``          server    (a) dictionary attack on FedALC's label-set tokens
``label_deanonymization``  server    (b) pseudonym → label name by co-occurrence graph matching
``embedding_identification`` server  (c) W row → label name from public per-label centroids
``membership_inference``   observer  (d) LOSS and LiRA (online, offline)
``one_run_audit``          auditor   (e) Steinke et al. one-run ε lower bound with canaries
``canary_client_audit``    auditor   (e') Andrew et al. one-shot ε estimate with canary clients
``update_inversion``       server    (f) a client's vocabulary from its first-layer update
``gradient_inversion``     server    (g) a client's images from its whole update (Geiping et al.)
=========================  ========  ==========================================================

Each attack sees only its role's view (:mod:`threat_models.views`); see
:mod:`threat_models.base` for the interface and :func:`threat_models.audit.audit`
for the harness; the core finds attacks through the ``secure_fed.attacks`` entry points
(:mod:`threat_models.attack_specs`). In YAML: ``attacks: {run: [all]}``; on a finished run:
``secure-fed audit RUN_DIR``.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """Loaded on first use, so that finding an attack's spec imports no attack (and no torch)."""
    if name == "ATTACKS":  # name → attack class, for every registered attack (secure_fed.attacks entry points)
        from secure_fed.plugin_specs import attack_specs

        return {n: spec.load() for n, spec in attack_specs().items()}
    if name in ("Attack", "AttackResult", "Role"):
        from threat_models import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["ATTACKS", "Attack", "AttackResult", "Role"]
