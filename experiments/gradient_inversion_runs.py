"""Gradient inversion on images through the engine, end to end: each defence as the run really applies it.

    PYTHONPATH=. python experiments/gradient_inversion_runs.py [--batches 1,4,8] [--epsilon 8] [--out results/gradient_inversion]

Where ``python -m threat_models.attacks.gradient_inversion`` measures the attack on updates it computes and noises
itself, this script trains real one-round federations (16×16 digit mosaics, the MLP of
:data:`~threat_models.attacks.gradient_inversion.MEASURE_CONFIG`, 10 clients of ``batch`` images each, one local step of
plain SGD on the whole batch, every client in the round) with the ``gradient_inversion`` attack recorded before
training, and reads its PSNR/SSIM from the audit, per condition:

* ``none``: no layer; the server attacks each target's plaintext update.
* ``dp_instance``: ``privacy.local`` (DP-SGD in client training, one full-batch step: per-image clip C = 1, the
  full Gaussian noise added by the client itself) at the instance-level ε given: the update the server receives
  carries the noise.
* ``dp_instance_noise_off``: the same DP-SGD step with σ = 1e-9 (the clip kept): a control, what the row above owes
  to the noise rather than to the clip.
* ``secure_sum``: ``secure_aggregation``: the server sees only the masked uplinks' sum of the 10 clients, attacked
  as if it were the target's update.
* ``dp_clients_secure_sum``: ``privacy.client`` with ``noise: clients`` (each client's discrete Gaussian share,
  client-level ε given) inside the secure sum.

The run's own privacy report gives the ε that is printed (instance unit for ``dp_instance``, client unit for
``dp_clients_secure_sum``). Writes ``runs.csv`` and ``table.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

from threat_models.attacks.gradient_inversion import MEASURE_CONFIG, ONE_STEP_ROUND

CONDITIONS = {
    "none": lambda eps: [],
    "dp_instance": lambda eps: [
        "protocols=[dp]",
        f"privacy.local={{target_epsilon: {eps}, clip_norm: 1.0, batch_sample_rate: 1.0}}",
    ],
    "dp_instance_noise_off": lambda eps: [
        "protocols=[dp]",
        "privacy.local={noise_multiplier: 1e-9, clip_norm: 1.0, batch_sample_rate: 1.0}",
    ],
    "secure_sum": lambda eps: ["protocols=[secure_aggregation]"],
    "dp_clients_secure_sum": lambda eps: [
        "protocols=[dp,secure_aggregation]",
        f"privacy.client={{target_epsilon: {eps}, clip_norm: 1.0, noise: clients}}",
    ],
}
UNIT = {"dp_instance": "instance", "dp_clients_secure_sum": "client"}


def run_overrides(batch: int, *, targets: int, steps: int, seed: int) -> list[str]:
    """One round of 10 clients holding ``batch`` mosaics each, one plain-SGD step on the whole batch."""
    return [
        *MEASURE_CONFIG,
        f"dataset.mosaics={{grid: 2, tile_size: 8, num_train: {10 * batch}, num_test: 200}}",
        *ONE_STEP_ROUND,
        f"training.batch_size={batch}",
        f"attacks.gradient_inversion={{targets: {targets}, steps: {steps}}}",
        f"seed={seed}",
    ]


def measure_run(overrides: list[str], unit: str | None) -> dict:
    """Train, audit, and return the attack's scores and the unit's reported ε (∞ without that unit)."""
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_experiment
    from threat_models.audit import audit
    from threat_models.context import AuditContext

    with tempfile.TemporaryDirectory(prefix="secure-fed-inversion-") as tmp:
        exp = build_experiment(load_plan(overrides=overrides), run_dir=Path(tmp) / "run")
        exp.run(progress=False)
        ctx = AuditContext(exp)
        res = audit(ctx, progress=False)["attacks"]["gradient_inversion"]
        units = ctx.privacy().get("units", {})
        eps = float(units[unit]["epsilon"]) if unit in units else float("inf")
    m, c, d = res["metrics"], res["chance"], res["details"]
    return {"psnr": m["psnr"], "ssim": m["ssim"], "chance_psnr": c["psnr"], "chance_ssim": c["ssim"],
            "source": m["source"], "uplinks": d["uplinks"], "cohort": d["cohort"], "epsilon": eps}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,4,8", help="images per client (comma-separated)")
    ap.add_argument("--epsilon", type=float, default=8.0, help="target ε of the DP conditions (δ: the config's)")
    ap.add_argument("--targets", type=int, default=4, help="clients attacked per run")
    ap.add_argument("--steps", type=int, default=300, help="the attack's Adam steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/gradient_inversion")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        base = run_overrides(batch, targets=args.targets, steps=args.steps, seed=args.seed)
        for name, extra in CONDITIONS.items():
            t0 = time.perf_counter()
            r = measure_run([*base, *extra(args.epsilon)], UNIT.get(name))
            rows.append({"batch": batch, "condition": name, **r, "seconds": round(time.perf_counter() - t0, 1)})
            print(rows[-1], flush=True)
    with open(out / "runs.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| batch | " + " | ".join(CONDITIONS) + " | mean image (chance) |", "| --- " * (len(CONDITIONS) + 2) + "|"]
    for batch in sorted({r["batch"] for r in rows}):
        cells = {r["condition"]: r for r in rows if r["batch"] == batch}
        fmt = [f"{cells[c]['psnr']:.1f} / {cells[c]['ssim']:.2f}" for c in CONDITIONS]
        chance = cells["none"]
        lines.append(f"| {batch} | " + " | ".join(fmt) + f" | {chance['chance_psnr']:.1f} / {chance['chance_ssim']:.2f} |")
    eps = {c: next(r["epsilon"] for r in rows if r["condition"] == c) for c in UNIT}
    lines.append("")
    lines.append("PSNR (dB) / SSIM. Reported ε: " + ", ".join(f"{c} {e:.3f} ({UNIT[c]} unit)" for c, e in eps.items()))
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
