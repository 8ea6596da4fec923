"""FLAG against FedAvg, local training and centralised training on CMDA clients (the FLAG paper's Table 1 and 2).

    python experiments/flag_cmda.py [--datasets scene,yeast,bibtex] [--seeds 0,1,2] [--alphas 0,0.3,0.6,1]
                                    [--workers 2] [--out results/flag_cmda] [--data-root DIR] [--report-only]

Every run uses ``experiments/configs/flag_cmda.yaml`` (10 CMDA clients, linear_head, Asymmetric Loss, Adam on
the clients, plain averaging on the server) with only the dataset, the seed and the algorithm changed, so no
method is tuned on its own: ``local`` (each client alone), ``fedavg`` (uniform weights), ``flag`` at each α
(``algorithm.flag_alpha``; α = 0.3 is the paper's default and the Table 1 row), ``centralised`` (all training
data on one trainer, reported at the epoch it selects on a validation split of its training data). Every method
is scored on the same clients' test rows (the partition's ``assign`` of the test split; same seed, same clients).

Figures per run, at its last round (centralised: its selected epoch): AmAP (each client's own model after its
local training, on its own test rows), WmAP (the worst client's), GmAP (the server's model on each client's test
rows, mean over clients) and its std over clients, and the rounds FLAG/FedAvg need to reach 80% and 95% of the
same seed's centralised GmAP (evaluated every round). The table gives mean ± std over seeds, and the paired
FLAG − FedAvg difference per seed. Outputs: ``OUT/table.md``, ``OUT/results.json``, ``OUT/per_seed.json``,
``OUT/curves_DATASET.png``; runs are cached in ``OUT/runs/`` (a finished run is skipped).
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

CONFIG = CONFIGS / "flag_cmda.yaml"
TARGETS = (0.8, 0.95)  # shares of the centralised GmAP (the paper's early-convergence measure, §5.2)
METRICS = ("AmAP", "WmAP", "GmAP", "GmAP_std")


def methods(alphas: list[float]) -> list[tuple[str, list[str]]]:
    """(method label, overrides) in table order."""
    out = [("local", ["algorithm.name=local"]), ("fedavg", ["algorithm.name=fedavg"])]
    out += [(f"flag α={a:g}", ["algorithm.name=flag", f"algorithm.flag_alpha={a}"]) for a in alphas]
    return [*out, ("centralised", ["algorithm.name=centralised"])]


def run_dir(out: Path, dataset: str, label: str, seed: int) -> Path:
    slug = label.replace(" α=", "-a").replace(" ", "_")
    return out / "runs" / dataset / f"{slug}-seed{seed}"


def curve(rd: Path, key: str = "GmAP") -> list[tuple[int, float]]:
    lines = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    return [(int(h["round"]), float(h[key])) for h in lines if key in h]


def figures(summary: dict[str, Any]) -> dict[str, float]:
    f = summary["final"]
    out = {k: f[k] for k in METRICS if k in f}
    if summary["algorithm"] == "centralised":  # Table 1's TResNet (G) row: WmAP is the worst client of the global model
        out["WmAP"] = f["GmAP_worst"]
    return out


def collect(args, out: Path) -> dict[str, Any]:
    per_seed: dict[str, Any] = {}
    for d in args.datasets:
        per_seed[d] = {}
        for seed in args.seeds:
            rows: dict[str, Any] = {}
            for label, _ in methods(args.alphas):
                rd = run_dir(out, d, label, seed)
                s = json.loads((rd / "summary.json").read_text())
                if s["status"] not in ("completed", "completed_with_aborts"):
                    raise SystemExit(f"error: {rd} ended with status {s['status']}: {s.get('stop_reason')}")
                rows[label] = figures(s)
            for share in TARGETS:
                target = share * rows["centralised"]["GmAP"]
                for label, _ in methods(args.alphas):
                    if label in ("local", "centralised"):
                        continue
                    c = curve(run_dir(out, d, label, seed))
                    rows[label][f"rounds_to_{share:g}"] = next((r for r, v in c if v >= target), None)
            per_seed[d][seed] = rows
    return per_seed


def mean_std(values: list[float | None]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "—"
    s = f"{np.mean(v):.1f} ± {np.std(v):.1f}"
    return s if len(v) == len(values) else f"{s} ({len(v)}/{len(values)})"


def report(args, per_seed: dict[str, Any], out: Path) -> str:
    lines = ["# FLAG vs FedAvg vs local vs centralised on CMDA clients", "",
             f"10 clients (k-modes over label vectors), seeds {', '.join(map(str, args.seeds))}; mean ± std over seeds "
             "(per run: the last round; centralised: the epoch selected on its validation split). GmAP std: the spread "
             "over clients within a run, averaged over seeds. Rounds to X%: first round with GmAP ≥ X% of the same "
             "seed's centralised GmAP ('(k/n)': reached in k of n seeds; '—': in none).", ""]  # fmt: skip
    results: dict[str, Any] = {}
    for d in args.datasets:
        seeds = per_seed[d]
        targets = [f"rounds_to_{share:g}" for share in TARGETS]
        head = "| method | AmAP | WmAP | GmAP | GmAP std over clients | " + " | ".join(f"rounds to {x:.0%}" for x in TARGETS)
        lines += [f"## {d}", "", head + " |", "|---" * (5 + len(TARGETS)) + "|"]
        results[d] = {}
        for label, _ in methods(args.alphas):
            col = {k: [seeds[s][label].get(k) for s in args.seeds] for k in (*METRICS, *targets)}
            results[d][label] = {k: [x for x in v if x is not None] for k, v in col.items()}
            lines.append(f"| {label} | " + " | ".join(mean_std(col[k]) for k in (*METRICS, *targets)) + " |")
        flag = "flag α=0.3" if "flag α=0.3" in results[d] else next(k for k in results[d] if k.startswith("flag"))
        diffs = {k: [seeds[s][flag][k] - seeds[s]["fedavg"][k] for s in args.seeds] for k in ("AmAP", "GmAP")}
        results[d]["flag_minus_fedavg"] = {"flag": flag, **diffs}
        lines += ["", f"{flag} − fedavg, paired by seed: AmAP {mean_std(diffs['AmAP'])} "
                  f"(per seed {', '.join(f'{x:+.2f}' for x in diffs['AmAP'])}), GmAP {mean_std(diffs['GmAP'])} "
                  f"(per seed {', '.join(f'{x:+.2f}' for x in diffs['GmAP'])}).", ""]  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=2))
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    return text


def plot(args, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for d in args.datasets:
        fig, ax = plt.subplots(figsize=(6, 4))
        for label, _ in methods(args.alphas):
            key = "AmAP" if label == "local" else "GmAP"
            cs = [curve(run_dir(out, d, label, s), key) for s in args.seeds]
            n = min(len(c) for c in cs)
            if n == 0:
                continue
            ys = np.mean([[v for _, v in c[:n]] for c in cs], axis=0)
            ax.plot([r for r, _ in cs[0][:n]], ys, label=f"{label} ({key})")
        ax.set(xlabel="round (centralised: epoch)", ylabel="mAP on the clients' test rows (%)", title=f"{d}: CMDA, 10 clients")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"curves_{d}.png", dpi=120)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default="scene,yeast,bibtex")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--alphas", default="0,0.3,0.6,1")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="results/flag_cmda")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    args.datasets = args.datasets.split(",")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.alphas = [float(a) for a in args.alphas.split(",")]
    out = Path(args.out)
    if not args.report_only:
        jobs = [(str(CONFIG), [f"seed={seed}", f"dataset.name={d}", *ov], str(run_dir(out, d, label, seed)), args.data_root, 1)
                for d in args.datasets for seed in args.seeds for label, ov in methods(args.alphas)]  # fmt: skip
        run_jobs(jobs, args.workers)
    per_seed = collect(args, out)
    (out / "per_seed.json").write_text(json.dumps(per_seed, indent=2))
    plot(args, out)
    print(report(args, per_seed, out))


if __name__ == "__main__":
    main()
