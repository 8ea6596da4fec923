"""The attacks as the core sees them before a run (``secure-fed list``, ``attacks.run`` validation).

Registered through the ``secure_fed.attacks`` entry points. Light on purpose: the attack modules are
imported only when an audit runs. Each attack class takes its name, role and descriptions from here.
"""

from __future__ import annotations

from secure_fed.plugin_specs import AttackSpec


def _test_rows(shape, cfg) -> int:
    return shape.test if cfg.evaluation.max_test is None else min(shape.test, cfg.evaluation.max_test)


# the attacks that densify label matrices (their matching and scoring are over dense label vectors)
def _deanonymization_bytes(shape, cfg) -> float:
    """The label sets densified (float32, at most one per training instance), the public test labels (int8) and
    four C × C float64 co-occurrence profiles."""
    C = shape.labels
    return shape.train * C * 4 + shape.test * C + 4 * 8 * C * C


def _identification_bytes(shape, cfg) -> float:
    """The test labels as a dense bool matrix and per-label centroids of g(x)."""
    return _test_rows(shape, cfg) * shape.labels + 2 * 4 * shape.labels * cfg.model.embedding_dim


def _membership_bytes(shape, cfg) -> float:
    """Target instances' label vectors densified (bool), at most the training split."""
    return shape.train * shape.labels


TOKEN_LINKAGE = AttackSpec(
    name="token_linkage",
    role="server",
    needs="the label-set replies it received; a candidate pool holding part of the training instances plus distractors",
    defended_by="keyed_hashing",
    description="recompute public SHA-256 tokens of candidate instances and link them to label sets and clients; "
    "reports the linked fraction of training instances and the precision of the links",
    scores={"linked": "linked", "precision": "precision"},
    implementation="threat_models.attacks.token_linkage:TokenLinkage",
)

LABEL_DEANONYMIZATION = AttackSpec(
    name="label_deanonymization",
    role="server",
    needs="the merged label sets (rows = W rows); public label co-occurrence from a disjoint split",
    defended_by="none fully: keyed_hashing pseudonyms hide names only up to co-occurrence structure",
    description="match pseudonymised W rows to label names by frequency and co-occurrence graph matching; reports "
    "the re-identified fraction of rows (top-1 and top-5)",
    scores={"reidentified": "re-identified", "reidentified_top5": "top-5"},
    implementation="threat_models.attacks.label_deanonymization:LabelDeanonymization",
    memory=_deanonymization_bytes,
)

EMBEDDING_IDENTIFICATION = AttackSpec(
    name="embedding_identification",
    role="server",
    needs="θ and the W rows (or one client's row); auxiliary labelled data (the public test split)",
    defended_by="dp (privacy.client)",
    description="name each class-embedding row by its similarity to public per-label centroids of g(x); reports "
    "top-1 and top-5 accuracy",
    scores={"top1": "top-1", "top5": "top-5"},
    implementation="threat_models.attacks.embedding_identification:EmbeddingIdentification",
    memory=_identification_bytes,
)

MEMBERSHIP_INFERENCE = AttackSpec(
    name="membership_inference",
    role="observer",
    needs="the released θ and W; the target instances with their labels; for LiRA and RMIA, the training recipe (public config)",
    defended_by="dp (privacy.client; or the instance unit, which covers W's label-set step and, with privacy.local, "
    "DP-SGD in client training)",
    description="LOSS threshold; with shadow runs, LiRA and RMIA (Zarifzadeh et al. 2024), each online and offline; "
    "per score AUC and TPR at 1% and 0.1% FPR with bootstrap intervals, log-scale ROC",
    scores={"loss": "LOSS", "lira_online": "LiRA", "lira_offline": "LiRA", "rmia_online": "RMIA", "rmia_offline": "RMIA"},
    implementation="threat_models.attacks.membership_inference:MembershipInference",
    memory=_membership_bytes,
)

ONE_RUN_AUDIT = AttackSpec(
    name="one_run_audit",
    role="auditor",
    needs="canaries inserted during training (attacks.one_run_audit.canaries > 0), θ⁰ and the released θ",
    defended_by="dp (privacy.client)",
    description="Steinke et al. one-run audit with Dirac canaries: an empirical ε lower bound at 95% confidence "
    "(and a GDP μ lower bound)",
    scores={"epsilon_lower_bound": "ε lower bound", "gdp_mu_lower_bound": "μ lower bound"},
    implementation="threat_models.attacks.one_run_audit:OneRunAudit",
)

CANARY_CLIENT_AUDIT = AttackSpec(
    name="canary_client_audit",
    role="auditor",
    needs="canary clients inserted during training (attacks.canary_client_audit.canaries > 0), θ⁰ and the released θ",
    defended_by="dp (privacy.client)",
    description="Andrew et al. one-shot estimate: ε of the Gaussians fitted to inserted vs held-out canary clients' "
    "cosines with the final model delta (an estimate, not a bound), with a bootstrap interval",
    scores={"epsilon_estimate": "ε", "epsilon_estimate_ci95": "interval"},
    implementation="threat_models.attacks.canary_client_audit:CanaryClientAudit",
)

UPDATE_INVERSION = AttackSpec(
    name="update_inversion",
    role="server",
    needs="the uplinks of one round as they cross the wire (the last round run); public feature frequencies",
    defended_by="secure_aggregation or ckks (the server gets only the cohort's sum)",
    description="recover each client's vocabulary from the first-layer columns its update touches; reports the F1 "
    "of the recovered words",
    scores={"f1": "F1"},
    implementation="threat_models.attacks.update_inversion:UpdateInversion",
)

GRADIENT_INVERSION = AttackSpec(
    name="gradient_inversion",
    role="server",
    needs="image data; whole uplinks of one round and θ as sent (recorded when configured before training); "
    "the public architecture, loss and preprocessing; for a batch > 1 the target's labels (given); public images",
    defended_by="dp (noise the server cannot remove: privacy.local (DP-SGD) or privacy.client.noise: clients) or "
    "secure_aggregation / ckks",
    description="Geiping et al. 2020: images whose gradient matches a client's update in cosine, with a TV prior; PSNR/SSIM",
    scores={"psnr": "PSNR", "ssim": "SSIM"},
    implementation="threat_models.attacks.gradient_inversion:GradientInversion",
)
