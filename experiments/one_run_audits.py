"""The one-run audits side by side (issue 46): Steinke et al.'s bound, the f-DP/GDP bound and the canary-client estimate.

Usage::

    python experiments/one_run_audits.py [--out results/one_run_audits] [--epsilons 2,4,8]

On the synthetic default (100 IID clients, 12 rounds of Poisson sampling at q = ½, FedAvg server step, θ of 1,072
trained coordinates) with client-level DP at each target ε and with the noise off (σ = 1e-9, the control); the same
with every client in every round (q = 1: a composition of Gaussians, whose GDP ε is a lower bound rather than an
estimate); and on the tests' fixed-encoder DP-SGD run (instance unit, one full-batch step) at each ε. Per row, from one run with
``one_run_audit`` (1,000 Dirac canaries, ``reference: noise_free_replay``, 95% confidence): Steinke et al.'s bound at
the capped audit δ (level/(4m)) and at the relation's own δ (0 where that δ makes it vacuous), the GDP μ and its ε at
the relation's δ; from a second run with ``canary_client_audit`` (40 canary clients, 400 held out; client unit only):
the canary-client estimate (equal variances) and its unequal-variance ε; and the accountant's ε (add/remove; the
client unit's relation for Dirac canaries is replacement, 2ε at (1 + e^ε)δ). Each run is seconds on a CPU; the
canaries are drawn from OS entropy, so reruns differ. Writes ``OUT/one_run_audits.csv`` and ``OUT/table.md``.
"""

from __future__ import annotations

import argparse
import csv
import math
import tempfile
from pathlib import Path

SYNTHETIC = ["evaluation.every=4", "output.progress=false", "output.checkpoint_every=12", "dataset.synthetic.num_train=400",
             "dataset.synthetic.num_test=200", "dataset.synthetic.num_labels=8", "dataset.synthetic.num_groups=2",
             "dataset.synthetic.num_features=16", "dataset.synthetic.feature_noise=0.6", "model.embedding_dim=16",
             "model.hidden_dims=[32]", "attacks.membership_inference.shadows=0"]  # fmt: skip
CLIENT = [*SYNTHETIC, "algorithm.name=fedavg", "partition.name=iid", "partition.num_clients=100", "training.rounds=12",
          "training.client_fraction=0.5", "training.sampling=poisson", "training.server_optimizer.name=fedavg",
          "training.server_optimizer.lr=1.0", "protocols=[dp]"]  # fmt: skip
#: every client in every round (q = 1): the run is a composition of Gaussian mechanisms, so its trade-off curve is
#: Gaussian (μ = √T/σ) and the GDP ε is a lower bound, not an estimate (with Poisson sampling it is an estimate)
CLIENT_FULL = [*CLIENT, "training.client_fraction=1.0"]
INSTANCE = [*SYNTHETIC, "training.rounds=1", "model.fixed_encoder=true", "model.hidden_dims=[]", "algorithm.name=fedaws",
            "training.batch_size=512", "training.client_lr=100", "training.server_optimizer.name=fedavg",
            "training.server_optimizer.lr=1.0", "protocols=[dp]", "model.embedding_dim=256"]  # fmt: skip
LOCAL = '"clip_norm": 1.0, "batch_sample_rate": 1.0, "max_labels_per_instance": 3'
STEINKE = ["attacks.run=[one_run_audit]", "attacks.one_run_audit.canaries=1000",
           "attacks.one_run_audit.reference=noise_free_replay"]  # fmt: skip
CANARY_CLIENTS = ["attacks.run=[canary_client_audit]", "attacks.canary_client_audit.canaries=40",
                  "attacks.canary_client_audit.held_out=400"]  # fmt: skip
FIELDS = ["unit", "target_epsilon", "accountant_epsilon", "relation_delta", "steinke_capped_delta", "audit_delta",
          "accountant_epsilon_audit_delta", "gdp_epsilon_audit_delta", "steinke_relation_delta",
          "vacuous_at_relation_delta", "gdp_mu", "gdp_epsilon_relation_delta", "canary_client_estimate",
          "canary_client_estimate_ci95", "canary_client_estimate_unequal_variance", "canary_client_mu"]  # fmt: skip


def audited(overrides: list[str], name: str) -> dict:
    """One run with the given overrides and its attack's result."""
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_experiment
    from threat_models.audit import audit
    from threat_models.context import AuditContext

    with tempfile.TemporaryDirectory(prefix="one-run-audits-") as tmp:
        e = build_experiment(load_plan(overrides=overrides), run_dir=Path(tmp) / "run")
        e.run(progress=False)
        return audit(AuditContext(e), progress=False, out_dir=tmp)["attacks"][name]


def row(unit: str, target: float, base: list[str], dp: str) -> dict:
    """Both audits of one configuration (the canary-client one for the client unit only)."""
    r = audited([*base, dp, *STEINKE], "one_run_audit")
    print(f"{unit} ε = {target}: one-run audit done", flush=True)
    m, plan = r["metrics"], r["details"]["audit_delta"]
    out = {"unit": unit, "target_epsilon": target, "accountant_epsilon": m["accountant_epsilon"],
           "relation_delta": plan["relation_delta"], "steinke_capped_delta": m["epsilon_lower_bound"],
           "audit_delta": r["details"]["delta"], "steinke_relation_delta": m["epsilon_lower_bound_at_relation_delta"],
           "vacuous_at_relation_delta": plan["vacuous_at_relation_delta"], "gdp_mu": m["gdp_mu_lower_bound"],
           "gdp_epsilon_relation_delta": m["epsilon_lower_bound_gdp"],
           # the same δ for both tests: the capped audit δ, and the accountant's ε (replacement for a client) at it
           "accountant_epsilon_audit_delta": m["replacement_epsilon"],
           "gdp_epsilon_audit_delta": r["details"]["gdp"]["epsilon_at_audit_delta"]}  # fmt: skip
    if unit.startswith("client"):
        c = audited([*base, dp, *CANARY_CLIENTS], "canary_client_audit")["metrics"]
        ci = c["epsilon_estimate_ci95"]
        out.update(canary_client_estimate=c["epsilon_estimate"], canary_client_mu=c["gdp_mu_estimate"],
                   canary_client_estimate_ci95=f"[{ci[0]:.3g}, {ci[1]:.3g}]",
                   canary_client_estimate_unequal_variance=c["epsilon_estimate_unequal_variance"])  # fmt: skip
    return out


def fmt(x) -> str:
    if isinstance(x, str):
        return x
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/one_run_audits")
    ap.add_argument("--epsilons", default="2,4,8")
    args = ap.parse_args(argv)
    eps = [float(e) for e in args.epsilons.split(",")]
    rows = [row("client", e, CLIENT, f'privacy.client={{"clip_norm": 0.5, "target_epsilon": {e}}}') for e in eps]
    rows.append(row("client", math.inf, CLIENT, 'privacy.client={"clip_norm": 0.5, "noise_multiplier": 1e-9}'))
    rows += [row("client, q = 1", e, CLIENT_FULL, f'privacy.client={{"clip_norm": 0.5, "target_epsilon": {e}}}') for e in eps]
    rows += [row("instance", e, INSTANCE, f'privacy.local={{{LOCAL}, "target_epsilon": {e}}}') for e in eps]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "one_run_audits.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    head = ["unit", "target ε", "accountant ε", "relation δ", "Steinke (relation δ)", "GDP ε (relation δ)", "GDP μ",
            "audit δ", "accountant ε (audit δ)", "Steinke (audit δ)", "GDP ε (audit δ)", "canary-client estimate [95%]",
            "(unequal var.)"]  # fmt: skip
    keys = ["unit", "target_epsilon", "accountant_epsilon", "relation_delta", "steinke_relation_delta",
            "gdp_epsilon_relation_delta", "gdp_mu", "audit_delta", "accountant_epsilon_audit_delta",
            "steinke_capped_delta", "gdp_epsilon_audit_delta", "canary_client_estimate_ci",
            "canary_client_estimate_unequal_variance"]  # fmt: skip
    for r in rows:
        if "canary_client_estimate" in r:
            r["canary_client_estimate_ci"] = f"{r['canary_client_estimate']:.3g} {r['canary_client_estimate_ci95']}"
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k in keys) + " |" for r in rows]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
