"""Is the centralised oracle the upper bound on dense Mulan data (scene, yeast)?

    python experiments/oracle_mulan.py [--datasets scene,yeast] [--seeds 0] [--out results/oracle_mulan]
                                       [--lrs 1e-4,3e-4,1e-3,3e-3] [--batches 16,64,256] [--epochs 60]
                                       [--data-root DIR] [--report-only]

For each dataset and seed it runs, with the shipped Bibtex recipe (``experiments/configs/bibtex_{method}.yaml``,
the same files ``reproduce_bibtex.py`` uses) and only the dataset and the model changed
(``dataset.name=DATASET``, ``model={name: mlp}``: the schema's MLP defaults for dense features):

* ``fedavg``, ``fedaws`` (λ = 10), ``fedalc`` (λ = 10): 300 rounds, positive-only partition, reported at the
  last round. Federated methods have no validation split, so they are **not tuned**: they keep the recipe.
* ``oracle``: the recipe as shipped (Adam lr 1e-3, batch 64, 30 epochs, evaluated every 2), reported at the
  epoch with the best P@1 on its validation split (10% of the *training* data; ``selected_round``).
* ``oracle_tuned``: a grid over the oracle's ``client_lr`` × ``batch_size``, each point trained for up to
  ``--epochs`` epochs and evaluated every epoch. Each point's score is its best *validation* P@1 (read from
  ``private/diagnostics.jsonl``, a statistic of training data only); the point with the highest score wins
  (ties go to the earlier point in grid order, the recipe's lr/batch first), and its reported model is the
  epoch it selected on validation. Test numbers are read only after the choice is made.
* ``oracle_tuned_refit``: the chosen lr/batch retrained on *all* training data (``validation_fraction=0``) for
  the chosen number of epochs, reported at its last epoch (no selection, nothing seen of the test split).

Two reference rows use no training: the label-frequency prior (labels ranked by their training frequency, the
same for every test row) and the perfect-ranking ceiling of P@k. Runs are cached in ``OUT/runs/`` (a finished
run is skipped, an unfinished one resumes). Outputs: ``OUT/results.json``, ``OUT/table.md`` and
``OUT/per_seed.json`` (every run's figures, the whole grid included; ``--report-only`` rebuilds the other two
from it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS, run_cached  # noqa: E402

FEDERATED = ("fedavg", "fedaws", "fedalc")
METHODS = (*FEDERATED, "oracle", "oracle_tuned", "oracle_tuned_refit")
KS = ("P@1", "P@3", "P@5")
RECIPE_LR, RECIPE_BATCH = 1e-3, 64  # experiments/configs/bibtex_oracle.yaml


def base_overrides(dataset: str, seed: int) -> list[str]:
    """What a user changes in the Bibtex recipe to run it on a dense Mulan set: the dataset and the model."""
    return [f"seed={seed}", f"dataset.name={dataset}", "model={name: mlp}", "output.progress=false"]


def run(method_cfg: str, overrides: list[str], run_dir: Path, data_root: str | None) -> dict[str, Any]:
    t = time.perf_counter()
    s = run_cached(str(CONFIGS / f"bibtex_{method_cfg}.yaml"), overrides, str(run_dir), data_root, 1)
    if s.get("status") not in ("completed", "completed_with_aborts"):
        raise SystemExit(f"error: {run_dir} ended with status {s.get('status')}: {s.get('stop_reason')}")
    print(f"    {run_dir.name}: done in {time.perf_counter() - t:.0f}s (wall of the run {s['wall_seconds']:.0f}s)", flush=True)
    return s


def validation_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(epoch, validation P@1) of a centralised run: training data only, from the operator's private diagnostics."""
    lines = (run_dir / "private" / "diagnostics.jsonl").read_text().splitlines()
    return [(int(d["round"]), float(d["validation_P@1"])) for d in map(json.loads, lines) if "validation_P@1" in d]


def best_validation(run_dir: Path) -> tuple[int, float]:
    """The epoch the run selected and its validation P@1 (the first maximum, as the engine keeps it)."""
    curve = validation_curve(run_dir)
    best = max(curve, key=lambda rv: rv[1])  # max returns the first maximum, like the engine's strict '>'
    return best


def fmt_num(x: float) -> str:
    return f"{x:g}"


def grid_points(lrs: list[float], batches: list[int]) -> list[tuple[float, int]]:
    pts = [(lr, b) for lr in lrs for b in batches]
    if (RECIPE_LR, RECIPE_BATCH) in pts:  # the recipe's point first: ties keep the shipped settings
        pts.remove((RECIPE_LR, RECIPE_BATCH))
        pts.insert(0, (RECIPE_LR, RECIPE_BATCH))
    return pts


def run_dataset_seed(dataset: str, seed: int, args, out: Path) -> dict[str, Any]:
    runs = out / "runs" / dataset
    base = base_overrides(dataset, seed)
    rec: dict[str, Any] = {}
    for m in (*FEDERATED, "oracle"):
        s = run(m, base, runs / f"{m}-seed{seed}", args.data_root)
        rec[m] = {
            "final": {k: s["final"][k] for k in KS},
            "wall_seconds": s["wall_seconds"],
            "rounds": s["rounds_completed"],
            "run_dir": str(runs / f"{m}-seed{seed}"),
        }
        if m == "oracle":
            rec[m]["selected_round"] = s["selected_round"]
            rec[m]["validation_P@1"] = best_validation(runs / f"oracle-seed{seed}")[1]

    # --- tune the oracle on its validation split only ---
    grid = []
    for lr, b in grid_points(args.lrs, args.batches):
        rd = runs / f"oracle_grid-lr{fmt_num(lr)}-b{b}-seed{seed}"
        ov = [
            *base,
            f"training.client_lr={lr}",
            f"training.batch_size={b}",
            f"training.rounds={args.epochs}",
            "evaluation.every=1",
        ]
        s = run("oracle", ov, rd, args.data_root)
        epoch, val = best_validation(rd)
        assert epoch == s["selected_round"], (rd, epoch, s["selected_round"])
        grid.append({"client_lr": lr, "batch_size": b, "selected_round": epoch, "validation_P@1": val, "run_dir": str(rd)})
    # the choice sees validation scores only (grid order breaks ties) ...
    chosen_i = max(range(len(grid)), key=lambda i: (grid[i]["validation_P@1"], -i))
    chosen = grid[chosen_i]
    # ... and only then is the chosen run's test result read
    s = json.loads((Path(chosen["run_dir"]) / "summary.json").read_text())
    rec["oracle_tuned"] = {"final": {k: s["final"][k] for k in KS}, **chosen, "rounds": args.epochs}
    print(
        f"    chosen on validation: lr {fmt_num(chosen['client_lr'])}, batch {chosen['batch_size']}, "
        f"epoch {chosen['selected_round']} (validation P@1 {chosen['validation_P@1']:.2f})",
        flush=True,
    )

    # --- refit the chosen settings on all training data, for the chosen number of epochs ---
    rd = runs / f"oracle_refit-lr{fmt_num(chosen['client_lr'])}-b{chosen['batch_size']}-e{chosen['selected_round']}-seed{seed}"
    ov = [
        *base,
        f"training.client_lr={chosen['client_lr']}",
        f"training.batch_size={chosen['batch_size']}",
        f"training.rounds={chosen['selected_round']}",
        "evaluation.every=1",
        "algorithm.validation_fraction=0",
    ]
    s = run("oracle", ov, rd, args.data_root)
    rec["oracle_tuned_refit"] = {
        "final": {k: s["final"][k] for k in KS},
        "client_lr": chosen["client_lr"],
        "batch_size": chosen["batch_size"],
        "rounds": s["rounds_completed"],
        "run_dir": str(rd),
    }
    rec["grid"] = [{k: v for k, v in g.items() if k != "run_dir"} for g in grid]
    return rec


def aggregate(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    seeds = sorted(per_seed)
    out: dict[str, Any] = {}
    for m in METHODS:
        rows = [per_seed[s][m] for s in seeds if m in per_seed[s]]
        if not rows:
            continue
        agg: dict[str, Any] = {"seeds": [s for s in seeds if m in per_seed[s]]}
        for k in KS:
            v = np.array([r["final"][k] for r in rows])
            agg[k], agg[f"{k}_per_seed"] = float(v.mean()), v.tolist()
            agg[f"{k}_std"] = float(v.std(ddof=1)) if len(v) > 1 else 0.0
        for extra in ("selected_round", "client_lr", "batch_size", "validation_P@1", "rounds"):
            if extra in rows[0]:
                agg[f"{extra}_per_seed"] = [r[extra] for r in rows]
        out[m] = agg
    fed_best = max(FEDERATED, key=lambda m: out[m]["P@1"]) if all(m in out for m in FEDERATED) else None
    if fed_best:
        cmp: dict[str, Any] = {"best_federated_by_P@1": fed_best}
        best = out[fed_best]
        for o in ("oracle", "oracle_tuned", "oracle_tuned_refit"):
            if o in out and out[o]["seeds"] == best["seeds"]:
                cmp[f"{o}_minus_best_federated"] = {k: out[o][k] - best[k] for k in KS}
                pairs = zip(out[o]["P@1_per_seed"], best["P@1_per_seed"], strict=True)
                cmp[f"{o}_minus_best_federated_per_seed_P@1"] = [a - b for a, b in pairs]
        out["comparison"] = cmp
    return out


def prior_baseline(dataset: str, data_root: str | None) -> dict[str, float]:
    """A reference point that uses no features: rank labels by their frequency in the training split."""
    from secure_fed.data.registry import load_registered
    from secure_fed.metrics import evaluate_scores

    ds = load_registered(dataset, data_root)
    freq = np.asarray(ds.train.labels.mean(axis=0)).ravel()
    y = ds.test.labels.toarray().astype(np.int8)
    m = evaluate_scores(np.tile(freq, (y.shape[0], 1)), y)
    card = y.sum(axis=1)  # the best any ranking can do: P@k = mean(min(|Y|, k)) / k
    ceiling = {k: float(100 * np.minimum(card, int(k[2:])).mean() / int(k[2:])) for k in KS}
    return {**{k: float(m[k]) for k in KS}, "num_test": int(y.shape[0]), "ceiling": ceiling}


def pm(a: dict[str, Any], k: str) -> str:
    return f"{a[k]:.2f}" + (f" ± {a[k + '_std']:.2f}" if len(a["seeds"]) > 1 else "")


def write_outputs(out: Path, results: dict[str, Any]) -> None:
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = [
        "| dataset | method | seeds | P@1 | P@3 | P@5 | oracle: lr / batch / epoch (per seed) | oracle P@1 − best federated |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "fedavg": "FedAvg",
        "fedaws": "FedAwS, λ = 10",
        "fedalc": "FedALC, λ = 10",
        "oracle": "oracle (recipe, untuned)",
        "oracle_tuned": "oracle (tuned on validation)",
        "oracle_tuned_refit": "oracle (tuned, refit on 100% train)",
    }
    for ds, r in results["datasets"].items():
        cmp = r.get("comparison", {})
        for m in METHODS:
            if m not in r:
                continue
            a = r[m]
            extra = ""
            if m == "oracle":
                extra = f"1e-3 / 64 / {', '.join(map(str, a['selected_round_per_seed']))} (of 30)"
            elif m in ("oracle_tuned", "oracle_tuned_refit"):
                epochs = a["selected_round_per_seed"] if m == "oracle_tuned" else a["rounds_per_seed"]
                pts = zip(a["client_lr_per_seed"], a["batch_size_per_seed"], epochs, strict=True)
                extra = "; ".join(f"{fmt_num(lr)} / {b} / {e}" for lr, b, e in pts)
                extra += f" (of {a['rounds_per_seed'][0]})" if m == "oracle_tuned" else " (last epoch)"
            gap = cmp.get(f"{m}_minus_best_federated", {}).get("P@1")
            name = names[m] + (" **best federated**" if m == cmp.get("best_federated_by_P@1") else "")
            lines.append(
                f"| {ds} | {name} | {len(a['seeds'])} | {pm(a, 'P@1')} | {pm(a, 'P@3')} | {pm(a, 'P@5')} | {extra} | "
                f"{'' if gap is None else f'{gap:+.2f}'} |"
            )
        if "prior" in r:
            p = r["prior"]
            lines.append(
                f"| {ds} | label-frequency prior (no features; reference) | — | {p['P@1']:.2f} | {p['P@3']:.2f} | "
                f"{p['P@5']:.2f} | | |"
            )
            c = p["ceiling"]
            lines.append(
                f"| {ds} | perfect ranking (ceiling of P@k; reference) | — | {c['P@1']:.2f} | {c['P@3']:.2f} | "
                f"{c['P@5']:.2f} | | |"
            )
    text = "\n".join(lines) + "\n"
    meta = results["meta"]
    text += (
        f"\nShared recipe: `experiments/configs/bibtex_<method>.yaml` with `{' '.join(meta['recipe_overrides'])}`; "
        "federated methods are not tuned (no validation split). Oracle grid: client_lr "
        f"{meta['grid']['client_lr']} × batch_size {meta['grid']['batch_size']}, up to {meta['grid']['epochs']} epochs, "
        "each point scored by its best P@1 on the validation split (10% of the training data); test numbers never "
        "enter the choice. P@k on the test split, `summary.json` `final`.\n"
    )
    for ds, r in results["datasets"].items():
        if "prior" in r and "oracle" in r:
            n, p1 = r["prior"]["num_test"], r["oracle"]["P@1"] / 100
            text += (
                f"\n{ds}: {n} test rows; the binomial standard error of a P@1 near {100 * p1:.0f}% is "
                f"{100 * (p1 * (1 - p1) / n) ** 0.5:.2f} points."
            )
    text += "\n"
    (out / "table.md").write_text(text)
    print(text)


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="scene,yeast")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--out", default="results/oracle_mulan")
    ap.add_argument("--lrs", default="1e-4,3e-4,1e-3,3e-3", help="oracle grid: client_lr values")
    ap.add_argument("--batches", default="16,64,256", help="oracle grid: batch_size values")
    ap.add_argument("--epochs", type=int, default=60, help="oracle grid: epochs per point (the epoch is selected on validation)")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--report-only", action="store_true", help="do not train; rebuild the outputs from OUT/per_seed.json")
    args = ap.parse_args(argv)
    args.lrs = [float(x) for x in args.lrs.split(",")]
    args.batches = [int(x) for x in args.batches.split(",")]
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "per_seed.json"
    per_seed: dict[str, dict[str, Any]] = json.loads(cache.read_text()) if cache.is_file() else {}

    if not args.report_only:
        import secure_fed

        t0 = time.perf_counter()
        for seed in seeds:  # seed-major: the first seed is complete before the next starts
            for ds in datasets:
                print(f"[{time.perf_counter() - t0:6.0f}s] {ds}, seed {seed}", flush=True)
                per_seed.setdefault(ds, {})[str(seed)] = run_dataset_seed(ds, seed, args, out)
                cache.write_text(json.dumps(per_seed, indent=2))
        print(f"all runs done in {time.perf_counter() - t0:.0f}s (secure_fed from {Path(secure_fed.__file__).parent})")
        code = {  # the code the runs used: the checkout's commit, unless secure_fed was imported from elsewhere
            "repo_head": git_commit(),
            "secure_fed_imported_from": str(Path(secure_fed.__file__).resolve().parent),
        }
        (out / "code.json").write_text(json.dumps(code, indent=2))

    results = {
        "meta": {
            "code": json.loads((out / "code.json").read_text()) if (out / "code.json").is_file() else None,
            "recipe_configs": {m: f"experiments/configs/bibtex_{m}.yaml" for m in (*FEDERATED, "oracle")},
            "recipe_overrides": ["dataset.name=<dataset>", "model={name: mlp}", "seed=<seed>"],
            "grid": {
                "client_lr": args.lrs,
                "batch_size": args.batches,
                "epochs": args.epochs,
                "evaluation_every": 1,
                "selection": "best validation P@1 (private/diagnostics.jsonl), validation = 10% of the training split",
            },
            "metric": "test split, summary.json final (federated: last round; oracle: its validation-selected epoch)",
        },
        "datasets": {
            ds: aggregate({int(s): r for s, r in per_seed[ds].items() if int(s) in seeds}) for ds in datasets if ds in per_seed
        },
        "per_seed": {ds: {s: r for s, r in per_seed[ds].items() if int(s) in seeds} for ds in datasets if ds in per_seed},
    }
    for ds, r in results["datasets"].items():
        r["prior"] = prior_baseline(ds, args.data_root)
    write_outputs(out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
