"""Privacy/utility of FedALC on Bibtex with instance-level server DP (DP-SGD on W over label sets).

Usage::

    python experiments/privacy_utility.py [--epsilons 1,2,4,8,inf] [--seeds N] [--rounds N] [--out DIR]

For each target ε (``inf`` = the same σ-weighted FedALC without the ``dp`` layer) and each seed
0..N−1 it runs ``configs/bibtex_fedalc_dp.yaml`` (cached and resumable under ``DIR/runs``), then writes

* ``DIR/results.json``: ε → {P@1, P@3, P@5: mean and std over seeds, accountant's final ε per seed,
  noise multiplier σ, steps};
* ``DIR/table.md``: the same as a Markdown table;
* ``DIR/p_at_1_vs_epsilon.png``: P@1 (mean ± std) against ε.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS, default_workers, run_cached  # noqa: E402

CONFIG = CONFIGS / "bibtex_fedalc_dp.yaml"


def overrides_for(eps: float, seed: int, rounds: int, clip_norm: float | None = None) -> list[str]:
    ov = [f"seed={seed}", f"training.rounds={rounds}", "output.progress=false"]
    if clip_norm is not None:
        ov.append(f"privacy.instance.clip_norm={clip_norm}")
    if math.isinf(eps):
        ov += ["protocols=[]", "privacy.instance=null"]
    else:
        ov += [f"privacy.instance.target_epsilon={eps}"]
    return ov


def tag(eps: float) -> str:
    return "inf" if math.isinf(eps) else f"{eps:g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilons", default="1,2,4,8,inf")
    ap.add_argument("--seeds", type=int, default=3, help="number of seeds (0..N-1)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--out", default="results/privacy_utility")
    ap.add_argument("--clip-norm", type=float, default=None, help="per-label-set clip C (default: the config's)")
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    ap.add_argument("--report-only", action="store_true", help="only aggregate finished runs")
    args = ap.parse_args(argv)
    eps_list = [float(e) for e in args.epsilons.split(",")]
    out = Path(args.out)
    jobs = [(e, s) for s in range(args.seeds) for e in eps_list]  # seed-major: every ε gets a first seed early
    summaries: dict[tuple[float, int], dict] = {}
    run_dir = lambda e, s: str(out / "runs" / f"eps_{tag(e)}_seed{s}")  # noqa: E731
    if not args.report_only:
        threads = max(1, (os.cpu_count() or 1) // args.workers)
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            futs = {
                (e, s): pool.submit(
                    run_cached,
                    str(CONFIG),
                    overrides_for(e, s, args.rounds, args.clip_norm),
                    run_dir(e, s),
                    args.data_root,
                    threads,
                )
                for e, s in jobs
            }
            for (e, s), f in futs.items():
                summaries[(e, s)] = f.result()
                fin = summaries[(e, s)]["final"]
                print(
                    f"ε={tag(e):>4} seed {s}: P@1 {fin['P@1']:.2f}  accountant ε {summaries[(e, s)]['privacy']['epsilon']}",
                    flush=True,
                )
    else:
        for e, s in jobs:
            p = Path(run_dir(e, s)) / "summary.json"
            if p.is_file():
                summaries[(e, s)] = json.loads(p.read_text())
    results = {}
    for e in eps_list:
        runs = [summaries[(e, s)] for s in range(args.seeds) if (e, s) in summaries]
        if not runs:
            continue
        entry = {"seeds": len(runs), "rounds": [r["rounds_completed"] for r in runs]}
        for k in ("P@1", "P@3", "P@5"):
            vals = [r["final"][k] for r in runs]
            entry[k] = {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0}
        priv = [r["privacy"] for r in runs]
        entry["accountant_epsilon"] = [p["epsilon"] for p in priv]
        entry["delta"] = priv[0]["delta"]
        unit = [p.get("units", {}).get("instance") for p in priv]
        entry["noise_multiplier"] = unit[0]["noise_multiplier"] if unit[0] else 0.0
        entry["status"] = [r["status"] for r in runs]
        results[tag(e)] = entry
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = [
        "| target ε | accountant ε (per seed) | σ | P@1 | P@3 | P@5 | seeds | rounds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t, r in results.items():
        eps_s = ", ".join(e if isinstance(e, str) else f"{e:.3f}" for e in r["accountant_epsilon"])
        pm = lambda k, r=r: f"{r[k]['mean']:.2f} ± {r[k]['std']:.2f}"  # noqa: E731
        lines.append(f"| {t} | {eps_s} | {r['noise_multiplier']:.3f} | {pm('P@1')} | {pm('P@3')} | {pm('P@5')} | "
                     f"{r['seeds']} | {max(r['rounds'])} |")  # fmt: skip
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plot(results, out / "p_at_1_vs_epsilon.png")
    return 0


def _plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [(float(t), r) for t, r in results.items() if t != "inf"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    if finite:
        xs = [x for x, _ in finite]
        ax.errorbar(xs, [r["P@1"]["mean"] for _, r in finite], yerr=[r["P@1"]["std"] for _, r in finite], marker="o",
                    capsize=3, label="FedALC + instance-level DP")  # fmt: skip
        ax.set_xscale("log", base=2)
    if "inf" in results:
        r = results["inf"]
        ax.axhline(r["P@1"]["mean"], color="k", ls="--", label=f"ε = ∞ ({r['P@1']['mean']:.2f})")
    ax.set(xlabel="target ε (δ = 1e-5)", ylabel="P@1 (%)", title="Bibtex: privacy vs utility")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
