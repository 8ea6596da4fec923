"""Every federated algorithm × every protocol stack on Bibtex, for a few rounds: does it run, what ε does it report.

Usage::

    python experiments/protocol_matrix.py [--rounds 2] [--fraction 0.05] [--out results/protocol_matrix]

Stacks: each layer alone, ``[keyed_hashing, dp, secure_aggregation]`` and ``[keyed_hashing, dp, ckks]``
(``keyed_hashing`` only where the algorithm collects label sets; combinations an algorithm does not allow
are listed with the config error that rejects them). Clients are Poisson-sampled with rate ``--fraction``
(what client-level DP accounting assumes). DP: instance-level target ε = 4 (C = 100, q = 0.1) for FedALC and
FedALC-fixed, client-level target ε = 8 (S = 1) for all. Writes ``DIR/results.json`` and ``DIR/table.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS, default_workers, run_cached  # noqa: E402

ALGORITHMS = ["fedavg", "fedavg_fixed", "fedaws", "fedalc", "fedalc_fixed", "oracle"]
STACKS = [
    ["keyed_hashing"],
    ["dp"],
    ["secure_aggregation"],
    ["ckks"],
    ["keyed_hashing", "dp", "secure_aggregation"],
    ["keyed_hashing", "dp", "ckks"],
]
LABEL_SETS = ("fedalc", "fedalc_fixed")


def stack_for(algo: str, stack: list[str]) -> list[str]:
    """Drop keyed_hashing from the combined stacks where there is no label-set collection to protect."""
    if len(stack) > 1 and algo not in LABEL_SETS:
        return [s for s in stack if s != "keyed_hashing"]
    return stack


def overrides(algo: str, stack: list[str], rounds: int, fraction: float) -> list[str]:
    ov = [
        f"algorithm.name={algo}",
        f"training.rounds={rounds}",
        f"training.client_fraction={fraction}",
        "training.sampling=poisson",
        "training.precision=bf16",
        f"evaluation.every={rounds}",
        "output.progress=false",
        "protocols=[" + ",".join(f'"{s}"' for s in stack) + "]",
    ]
    if "dp" in stack:
        if algo in LABEL_SETS:
            ov += ['privacy.instance={"target_epsilon": 4, "clip_norm": 100, "sample_rate": 0.1, "expected_batch_size": 488}']
            ov += ["algorithm.normalize_gamma=false"] if algo == "fedalc" else []  # a key of fedalc's own
        ov += ['privacy.client={"target_epsilon": 8, "clip_norm": 1.0}']
    return ov


def one(algo: str, stack: list[str], args_tuple) -> dict:
    rounds, fraction, out, data_root, threads = args_tuple
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import ConfigError

    ov = overrides(algo, stack, rounds, fraction)
    config = str(CONFIGS / ("bibtex_oracle.yaml" if algo == "oracle" else "bibtex_fedalc.yaml"))
    try:
        load_plan(config, ov)
    except ConfigError as e:
        return {"status": "rejected", "reason": str(e).split("(top level): ", 1)[-1]}
    s = run_cached(config, ov, str(Path(out) / "runs" / f"{algo}__{'+'.join(stack)}"), data_root, threads)
    metrics = Path(out) / "runs" / f"{algo}__{'+'.join(stack)}" / "metrics.jsonl"
    last = json.loads(metrics.read_text().splitlines()[-1])
    extra = {k: v for k, v in last.items() if k.startswith(("secagg_", "ckks_"))}
    return {
        "status": s["status"],
        "P@1": s["final"].get("P@1"),
        "epsilon": s["privacy"]["epsilon"],
        "delta": s["privacy"]["delta"],
        "units": {u: r["epsilon"] for u, r in s["privacy"].get("units", {}).items()},
        "seconds_per_round": s["seconds_per_round"],
        "rounds": s["rounds_completed"],
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fraction", type=float, default=0.05)
    ap.add_argument("--out", default="results/protocol_matrix")
    ap.add_argument("--workers", type=int, default=default_workers())
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    args = ap.parse_args(argv)
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    cells = [(a, stack_for(a, s)) for a in ALGORITHMS for s in STACKS]
    packed = (args.rounds, args.fraction, args.out, args.data_root, threads)
    results: dict[str, dict] = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        futs = {(a, tuple(s)): pool.submit(one, a, s, packed) for a, s in cells}
        for (a, s), f in futs.items():
            r = f.result()
            results.setdefault(a, {})["+".join(s)] = r
            what = f"P@1 {r['P@1']:.2f} ε {r['epsilon']}" if r["status"] != "rejected" else r["reason"]
            print(f"{a:>13} {'+'.join(s):<40} {r['status']:<10} {what}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    lines = ["| algorithm | stack | status | P@1 | ε (δ = 1e-5) | s/round |", "| --- | --- | --- | --- | --- | --- |"]
    for a, row in results.items():
        for s, r in row.items():
            if r["status"] == "rejected":
                lines.append(f"| {a} | {s} | rejected: {r['reason']} | | | |")
                continue
            eps = r["epsilon"] if isinstance(r["epsilon"], str) else f"{r['epsilon']:.3f}"
            if len(r["units"]) > 1:
                eps = ", ".join(f"{u} {v:.3f}" for u, v in r["units"].items())
            lines.append(f"| {a} | {s} | {r['status']} | {r['P@1']:.2f} | {eps} | {r['seconds_per_round']:.1f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
