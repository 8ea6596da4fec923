"""A custom attack: an honest-but-curious server guesses which clients hold the most data from their update norms.

An attack (:class:`threat_models.base.Attack`) comes in three steps, so that the attacker cannot read what its role
does not see: ``prepare`` (the simulator: auxiliary knowledge and the ground truth), ``run`` (the attacker: its
role's view and the auxiliary knowledge only) and ``score`` (the guess against the truth, beside chance). Here the
server ranks the clients of one recorded round by the L2 norm of their first-layer update (a client with more
instances takes more local steps in an epoch, so its update tends to be larger) and is scored by the Spearman
correlation between that ranking and the clients' true sizes (chance: 0). Under ``secure_aggregation`` the server
sees masked updates only and the attack reports itself skipped.

secure-fed finds attacks through the ``secure_fed.attacks`` entry points, each naming an
:class:`~secure_fed.plugin_api.attacks.AttackSpec`. In a package, declare it in ``pyproject.toml``::

    [project.entry-points."secure_fed.attacks"]
    update_norm_size = "my_package.attack:SPEC"

and ``secure-fed audit RUN_DIR --attacks update_norm_size`` runs it. This script registers the spec for its own
process instead (a ``*.dist-info`` directory on ``sys.path``, as ``pip install`` would leave one), trains with
``attacks.run: [update_norm_size]`` (so the server's view is recorded during training), then audits the finished
run with the audit API and writes ``private/attacks.json`` (operator-only: computed from the members).

    python examples/custom_attack.py --out runs/attack-example
    python examples/custom_attack.py --small --out /tmp/attack-example     # 2 rounds of a smaller problem
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from secure_fed.plugin_api.attacks import AttackSpec
from threat_models.attacks.data_size_ranking import spearman  # Spearman's ρ with average ranks for ties
from threat_models.base import Attack, AttackResult

SPEC = AttackSpec(
    name="update_norm_size",
    role="server",
    needs="the plaintext uplinks of one round (the last round run); nothing else",
    defended_by="secure_aggregation or ckks (the server gets only the cohort's sum); dp (privacy.client) clips the norms",
    description="rank the clients of a round by the norm of their first-layer update, as a guess of their data sizes",
    implementation="__main__:UpdateNormSize",  # in a package: "my_package.attack:UpdateNormSize"
)

SMALL = {
    "dataset": {"synthetic": {"num_train": 400, "num_test": 200, "num_features": 16, "num_labels": 8, "num_groups": 2}},
    "model": {"embedding_dim": 16, "hidden_dims": [32]},
}


class UpdateNormSize(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        if ctx.tap is None or ctx.tap.capture is None:
            return "the run recorded no round of uplinks (set attacks.run before training)"
        if ctx.tap.capture["individual"] is None:
            return f"the wire carried {ctx.tap.capture['uplink_kind']} updates: the server has their sum only"
        return None

    def prepare(self, ctx):
        cohort = ctx.tap.capture["cohort"]
        return {}, {"sizes": {cid: ctx.fed.clients[cid].num_examples for cid in cohort}}  # truth: private sizes

    def run(self, view, aux):
        updates = view.capture.individual  # the server's view: each client's Δ of the first θ parameter, as sent
        return {cid: float(delta.double().norm()) for cid, delta in updates.items()}

    def score(self, guess, truth):
        clients = sorted(guess)
        rho = spearman([guess[c] for c in clients], [truth["sizes"][c] for c in clients])
        return AttackResult(
            attack=self.name, role=self.role.value, metrics={"spearman": rho}, chance={"spearman": 0.0},
            details={"clients": len(clients)},
        )  # fmt: skip


def register(where: Path) -> None:
    """Make SPEC an entry point of the ``secure_fed.attacks`` group for this process."""
    from secure_fed import plugins
    from secure_fed.config import schema

    info = where / "update_norm_size_example-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: update-norm-size-example\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f'[secure_fed.attacks]\n{SPEC.name} = "__main__:SPEC"\n'.replace('"', ""))
    sys.path.insert(0, str(where))
    plugins.registry.cache_clear()  # the registry and the config schema were read without it
    schema.experiment_config_model.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocols", default="", help="comma-separated layers, e.g. secure_aggregation (skips the attack)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="2 rounds of a smaller problem (seconds)")
    parser.add_argument("--out", default="runs/attack-example", help="the run directory (must not hold a run)")
    args = parser.parse_args()

    import secure_fed
    from secure_fed.plugin_api.attacks import attacks_path

    with tempfile.TemporaryDirectory() as site:
        register(Path(site))
        from threat_models.audit import audit_run_dir, headline  # after register: it reads the attacks on import

        config = {
            "algorithm": {"name": "fedavg"},
            "training": {"rounds": 2 if args.small else args.rounds},
            "evaluation": {"every": 2 if args.small else 5},
            "output": {"progress": False},
            "protocols": [p for p in args.protocols.split(",") if p],
            "attacks": {"run": [SPEC.name]},  # records the server's view during training, and audits when it ends
            **(SMALL if args.small else {}),
        }
        result = secure_fed.run(config, run_dir=args.out)
        print(f"status: {result.status}, P@1 {result.metrics['P@1']:.2f}")
        # the audit API on the finished run (what `secure-fed audit RUN_DIR --attacks update_norm_size` calls)
        doc = audit_run_dir(result.run_dir, [SPEC.name], progress=False)
    entry = doc["attacks"][SPEC.name]
    print(f"{SPEC.name}: {headline(SPEC.name, entry)}")
    print(f"wrote {attacks_path(result.run_dir)}: {json.dumps(entry.get('metrics', entry))}")


if __name__ == "__main__":
    main()
