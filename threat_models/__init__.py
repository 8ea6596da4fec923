"""Attack simulators and privacy audits: what each protocol layer protects, measured.

=========================  ========  ==========================================================
attack                     role      measures
=========================  ========  ==========================================================
``token_linkage``          server    (a) dictionary attack on FedALC's label-set tokens
``label_deanonymization``  server    (b) pseudonym → label name by co-occurrence graph matching
``embedding_identification`` server  (c) W row → label name from public per-label centroids
``membership_inference``   observer  (d) LOSS and LiRA (online, offline)
``one_run_audit``          auditor   (e) Steinke et al. one-run ε lower bound with canaries
``update_inversion``       server    (f) a client's vocabulary from its first-layer update
=========================  ========  ==========================================================

Each attack sees only its role's view (:mod:`threat_models.views`); see
:mod:`threat_models.base` for the interface and :func:`threat_models.audit.audit`
for the harness. In YAML: ``attacks: {run: [all]}``; on a finished run:
``secure-fed audit RUN_DIR``.
"""

from __future__ import annotations

from threat_models.attacks.embedding_identification import EmbeddingIdentification
from threat_models.attacks.label_deanonymization import LabelDeanonymization
from threat_models.attacks.membership_inference import MembershipInference
from threat_models.attacks.one_run_audit import OneRunAudit
from threat_models.attacks.token_linkage import TokenLinkage
from threat_models.attacks.update_inversion import UpdateInversion
from threat_models.base import Attack, AttackResult, Role

#: Registered attacks by name.
ATTACKS: dict[str, type[Attack]] = {
    cls.name: cls
    for cls in (TokenLinkage, LabelDeanonymization, EmbeddingIdentification, MembershipInference, OneRunAudit, UpdateInversion)
}

__all__ = ["ATTACKS", "Attack", "AttackResult", "Role"]
