"""FedLGT's ablation (the FedLGT paper's Table 4) on CMDA clients: FedAvg with a plain head, FedC-Tran, + CA-MLE,
+ ULE, FedLGT and centralised C-Tran, in C-AP, O-AP, C-F1, O-F1 (Table 3's columns) and GmAP.

    python experiments/lgt_study.py [--datasets scene,digit_mosaics,yeast,emotions] [--seeds 0,1,2]
                                    [--workers 2] [--out results/lgt_study] [--data-root DIR] [--report-only]

Every run uses ``experiments/configs/lgt_study.yaml`` with only the dataset, the seed, the algorithm and its
switches changed, so every method gets the same tuning budget (none). Scene and digit mosaics get the six
methods; yeast and emotions FedC-Tran and FedLGT. Digit mosaics: 32×32 mosaics of 2×2 digits (1000 train /
300 test), ResNet-18 from random initialisation (explicit; no ImageNet weights here), 5 CMDA clients, 8 rounds;
at 32 px the ResNet's last map is 1×1, so C-Tran sees one feature token. ULE prompts: "The photo contains
[CLASS]." (scene, mosaics), "The gene has the function [CLASS]." (yeast), "The music sounds [CLASS]." (emotions).
Outputs ``OUT/table.md``, ``OUT/results.json``, ``OUT/per_seed.json``; runs are cached in ``OUT/runs/``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS, run_jobs  # noqa: E402

CONFIG = CONFIGS / "lgt_study.yaml"
METRICS = ("mAP", "O-AP", "C-F1", "O-F1", "GmAP")
LABELS = {"mAP": "C-AP", "O-AP": "O-AP", "C-F1": "C-F1", "O-F1": "O-F1", "GmAP": "GmAP"}

ALL_METHODS: list[tuple[str, list[str]]] = [
    ("FedAvg (plain head)", ["model.family=linear_head", "algorithm.name=fedavg"]),
    ("FedC-Tran", ["algorithm.name=fedctran"]),
    ("FedC-Tran + CA-MLE", ["algorithm.name=fedlgt", "algorithm.ule=false", "algorithm.ca_mle=true"]),
    ("FedC-Tran + ULE", ["algorithm.name=fedlgt", "algorithm.ule=true", "algorithm.ca_mle=false"]),
    ("FedLGT", ["algorithm.name=fedlgt"]),
    ("centralised C-Tran", ["algorithm.name=centralised"]),
]
SHORT = ("FedC-Tran", "FedLGT")  # the methods run on yeast and emotions

DATASET: dict[str, list[str]] = {
    "scene": ["dataset.name=scene"],
    "yeast": ["dataset.name=yeast", "model.label_prompt=The gene has the function [CLASS]."],
    "emotions": ["dataset.name=emotions", "model.label_prompt=The music sounds [CLASS]."],
    "digit_mosaics": [
        "dataset.name=digit_mosaics",
        "dataset.mosaics={grid: 2, tile_size: 16, num_train: 1000, num_test: 300}",
        "model.name=resnet18",
        "model.weights=random",
        "partition.num_clients=5",
        "training.rounds=8",
        "evaluation.every=4",
    ],
}


def methods(dataset: str) -> list[tuple[str, list[str]]]:
    if dataset in ("scene", "digit_mosaics"):
        return ALL_METHODS
    return [m for m in ALL_METHODS if m[0] in SHORT]


def run_dir(out: Path, dataset: str, label: str, seed: int) -> Path:
    slug = label.lower().replace(" + ", "+").replace(" ", "_").replace("(", "").replace(")", "")
    return out / "runs" / dataset / f"{slug}-seed{seed}"


def collect(args, out: Path) -> dict[str, Any]:
    per_seed: dict[str, Any] = {}
    for d in args.datasets:
        per_seed[d] = {}
        for seed in args.seeds:
            rows = {}
            for label, _ in methods(d):
                rd = run_dir(out, d, label, seed)
                s = json.loads((rd / "summary.json").read_text())
                if s["status"] not in ("completed", "completed_with_aborts"):
                    raise SystemExit(f"error: {rd} ended with status {s['status']}: {s.get('stop_reason')}")
                rows[label] = {k: s["final"][k] for k in METRICS if k in s["final"]}
            per_seed[d][seed] = rows
    return per_seed


def mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.1f} ± {np.std(values):.1f}" if values else "—"


def report(args, per_seed: dict[str, Any], out: Path) -> str:
    lines = ["# FedLGT ablation on CMDA clients", "",
             f"Seeds {', '.join(map(str, args.seeds))}; mean ± std over seeds, last round (centralised: the epoch it "
             "selects on 10% of its training data). C-AP = macro mAP, O-AP = AP over all (instance, label) pairs, "
             "C-F1/O-F1 at threshold 0.5, GmAP = the global model on each client's test rows.", ""]  # fmt: skip
    results: dict[str, Any] = {}
    for d in args.datasets:
        seeds = per_seed[d]
        lines += [f"## {d}", "", "| method | " + " | ".join(LABELS[k] for k in METRICS) + " |", "|---" * (1 + len(METRICS)) + "|"]
        results[d] = {}
        for label, _ in methods(d):
            col = {k: [seeds[s][label][k] for s in args.seeds if k in seeds[s][label]] for k in METRICS}
            results[d][label] = col
            lines.append(f"| {label} | " + " | ".join(mean_std(col[k]) for k in METRICS) + " |")
        pairs = [("FedLGT", "FedC-Tran")] + ([("FedC-Tran", "FedAvg (plain head)")] if d in ("scene", "digit_mosaics") else [])
        lines.append("")
        for a, b in pairs:
            diff = [seeds[s][a]["mAP"] - seeds[s][b]["mAP"] for s in args.seeds]
            results[d][f"{a} − {b} C-AP"] = diff
            lines.append(f"{a} − {b}, C-AP paired by seed: {mean_std(diff)} (per seed {', '.join(f'{x:+.2f}' for x in diff)}).")
        lines.append("")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="scene,digit_mosaics,yeast,emotions")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="results/lgt_study")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    args.datasets = args.datasets.split(",")
    unknown = [d for d in args.datasets if d not in DATASET]
    if unknown:
        raise SystemExit(f"error: --datasets: unknown {', '.join(unknown)} (use {', '.join(DATASET)})")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    if not args.report_only:
        jobs = [(str(CONFIG), [f"seed={seed}", *DATASET[d], *ov], str(run_dir(out, d, label, seed)), args.data_root, 1)
                for d in args.datasets for seed in args.seeds for label, ov in methods(d)]  # fmt: skip
        run_jobs(jobs, args.workers)
    per_seed = collect(args, out)
    (out / "per_seed.json").write_text(json.dumps(per_seed, indent=2))
    print(report(args, per_seed, out))


if __name__ == "__main__":
    main()
