"""How memory and time grow with the label count: peak RSS and seconds of setup and of one round, on XC-shaped
synthetic data written by ``secure-fed data synth-xc``, with the fitted growth exponent of each.

    python benchmarks/scale.py [--labels 1000,4000,13330,131072] [--algorithms fedavg,fedaws,fedalc]
                               [--like amazon-670k] [--dp] [--client-fraction 0.01] [--set KEY=VALUE]
                               [--workdir DIR] [--json FILE]

For each label count C the data are ``--like``'s shape scaled so that C labels remain (instances scale with the
labels: instances per label stay as published; features and non-zeros per row stay as published). Each
(algorithm, C) runs in a fresh process (so its peak RSS is its own): load and set up (label sets and FedALC's
weights included), then one round with ``--client-fraction`` of the clients, then one evaluation on at most
``--max-test`` test rows. Printed: seconds of setup, of the round, of its server step (the algorithm's W step),
of the evaluation, and the peak RSS; then, per algorithm, the exponent b of a least-squares fit
``seconds ∝ C^b`` (setup, server step) and ``RSS ∝ C^b`` between the two largest label counts measured.

``--dp`` adds FedALC with ``privacy.instance`` (the per-label-set DP step on W). With the approximate neighbour
search (``--set algorithm.neighbour_search=approximate``) FedALC's line also shows the step's recall against the
exact search on 256 classes. ``--json`` writes every figure.
The 512 → 1024 → 1024 → 512 network of the papers is used throughout.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRIVER = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from secure_fed.config import load_config
from secure_fed.engine import Experiment
cfg = load_config(None, json.loads(sys.argv[1]))
exp = Experiment(cfg, run_dir=sys.argv[2])
exp.setup()
t_setup = time.perf_counter() - t0
step = {"s": 0.0}
real = exp.algorithm.server_step
def timed(*a, **k):
    t = time.perf_counter(); out = real(*a, **k); step["s"] += time.perf_counter() - t; return out
exp.algorithm.server_step = timed
t = time.perf_counter(); stats = exp.train_round(); t_round = time.perf_counter() - t
t = time.perf_counter(); m = exp.evaluate(); t_eval = time.perf_counter() - t
print(json.dumps({"setup_s": t_setup, "round_s": t_round, "server_step_s": step["s"], "eval_s": t_eval,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "clients": len(exp.fed.clients), "P@1": m["P@1"], "neighbour_recall": stats.get("neighbour_recall"),
                  "estimate_gb": exp.memory.total / 1e9}))
"""


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x (None with fewer than two points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", default="1000,4000,13330,131072")
    ap.add_argument("--algorithms", default="fedavg,fedaws,fedalc")
    ap.add_argument("--like", default="amazon-670k")
    ap.add_argument("--dp", action="store_true", help="also FedALC with privacy.instance")
    ap.add_argument("--client-fraction", type=float, default=0.01)
    ap.add_argument("--max-test", type=int, default=2000)
    ap.add_argument("--k", type=int, default=50, help="FedALC's K and FedAwS's k")
    ap.add_argument("--workdir", default=None, help="where the generated data go (default: a temporary folder)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (e.g. algorithm.neighbour_search=approximate)")  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from secure_fed.data.synth_xc import SHAPES, scaled_shape, synth_xc

    labels = [int(x) for x in args.labels.split(",")]
    algos = args.algorithms.split(",")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="secure-fed-scale-"))
    runs: list[tuple[str, list[str]]] = [(a, [f"algorithm.name={a}"]) for a in algos]
    if args.dp:
        dp = ["algorithm.name=fedalc", "algorithm.normalize_gamma=false",
              "privacy.instance={target_epsilon: 4.0, clip_norm: 1000.0, sample_rate: 0.01}", "protocols=[dp]"]  # fmt: skip
        # B̄ per shape below: q × the shape's published training size (a public fact, never the generated count)
        runs.append(("fedalc+privacy.instance", dp))
    full = SHAPES[args.like]
    rows = []
    print(f"{'run':<26} {'labels':>8} {'clients':>8} {'setup s':>8} {'round s':>8} {'W step s':>8} {'eval s':>7} "
          f"{'peak GB':>8} {'est. GB':>8}")  # fmt: skip
    for C in labels:
        scale = min(1.0, C / full.labels)
        data = work / f"{args.like}-{C}"
        if not (data / "test.txt").exists():
            synth_xc(args.like, out=data, scale=scale, seed=0)
        for name, over in runs:
            overrides = [
                f"dataset={{format: xc, train: {data}/train.txt, test: {data}/test.txt}}", "device=cpu",
                "model={name: sparse_text, embedding_dim: 512, embed_dim: 512, hidden_dims: [1024, 1024]}",
                f"training.client_fraction={args.client_fraction}", "training.rounds=1", f"algorithm.k={args.k}",
                f"evaluation.max_test={args.max_test}", "output.progress=false", *over, *args.overrides,
            ]  # fmt: skip
            if any(o.startswith("privacy.instance=") for o in over):
                overrides.append(f"privacy.instance.expected_batch_size={0.01 * scaled_shape(args.like, scale).train:g}")
            with tempfile.TemporaryDirectory() as run_dir:
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(overrides), run_dir],
                                      capture_output=True, text=True)  # fmt: skip
                wall = time.perf_counter() - t
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                print(f"{name:<26} {C:>8} failed: {tail}")
                rows.append({"run": name, "labels": C, "error": tail})
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            r.update(run=name, labels=C, wall_s=wall)
            rows.append(r)
            recall = f"  recall {r['neighbour_recall']:.3f}" if r.get("neighbour_recall") is not None else ""
            print(f"{name:<26} {C:>8} {r['clients']:>8} {r['setup_s']:>8.1f} {r['round_s']:>8.1f} {r['server_step_s']:>8.2f} "
                  f"{r['eval_s']:>7.1f} {r['peak_rss_gb']:>8.2f} {r['estimate_gb']:>8.2f}{recall}", flush=True)  # fmt: skip
    print("\ngrowth exponent b (cost ∝ C^b) between the two largest label counts measured, and over all of them:")
    fits = {}
    for name, _ in runs:
        ok = [r for r in rows if r["run"] == name and "error" not in r]
        fits[name] = {}
        for key in ("setup_s", "server_step_s", "peak_rss_gb"):
            xs, ys = [r["labels"] for r in ok], [r[key] for r in ok]
            fits[name][key] = {"last_two": fit_exponent(xs[-2:], ys[-2:]), "all": fit_exponent(xs, ys)}
        label = {"setup_s": "setup", "server_step_s": "W step", "peak_rss_gb": "peak RSS"}
        show = "  ".join(
            f"{label[k]} {v['last_two']:.2f} (all {v['all']:.2f})" if v["last_two"] is not None else f"{label[k]} -"
            for k, v in fits[name].items()
        )
        print(f"  {name:<26} {show}")
    if args.json:
        Path(args.json).write_text(json.dumps({"like": args.like, "runs": rows, "exponents": fits}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
