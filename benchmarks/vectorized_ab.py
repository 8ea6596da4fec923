"""Benchmark: the vectorised executor's speed-up over the sequential one on Bibtex FedALC, the commit this branch
started from (A) against this checkout (B), measured in the same run.

    python benchmarks/vectorized_ab.py [--base COMMIT] [--reps 3] [--rounds 3] [--client-fraction 0.25]
                                       [--precision fp32] [--set KEY=VALUE ...] [--data-root DIR] [--json FILE]

A git worktree of ``--base`` (default: ``main``'s merge base with HEAD) is made in a temporary folder. Then ``--reps``
pairs of child processes run, A and B alternating (A first in even pairs, B first in odd ones, so drift on a shared
machine falls on both), each with ``PYTHONPATH`` set to its own tree and one thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``). Each child times both executors **in one process** with that tree's own
``benchmarks/executors.py`` (``seconds_per_round``: one experiment per executor, one warm-up round each, then
``--rounds`` rounds of each interleaved) on ``experiments/configs/bibtex_fedalc.yaml`` with ``training.client_fraction``
(default 0.25: about 40 of the 159 clients a round, to keep the whole run within a few minutes) and ``--set``
overrides, and reports its speed-up (sequential s/round ÷ vectorised s/round). Prints every child's figures, the
median speed-up of A and of B, and their ratio B/A (≥ 1: the vectorised speed-up did not drop).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "experiments/configs/bibtex_fedalc.yaml"

#: the child: both executors timed in one process on its own tree's code
CHILD = """
import json, runpy, sys
import torch
torch.set_num_threads(1)
import secure_fed
tree, config, overrides, rounds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
assert secure_fed.__file__.startswith(tree), (secure_fed.__file__, tree)
bench = runpy.run_path(tree + "/benchmarks/executors.py")
secs, exps, times = bench["seconds_per_round"](tree + "/" + config, overrides, ("sequential", "vectorized"), rounds)
report = exps["vectorized"].executor.report()
print(json.dumps({"s_per_round": secs, "round_seconds": times, "executor": report,
                  "clients": sum(1 for _ in exps["vectorized"].fed.clients)}))
"""


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def child(tree: Path, overrides: list[str], rounds: int, data_root: str) -> dict:
    """One child process on ``tree``'s code: both executors' seconds per round, measured in that one process."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "SECURE_FED_DATA": data_root}
    r = subprocess.run([sys.executable, "-c", CHILD, str(tree), CONFIG, json.dumps(overrides), str(rounds)],
                       cwd=tree, env=env, capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"error: the child on {tree} failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["speedup"] = out["s_per_round"]["sequential"] / out["s_per_round"]["vectorized"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=None, help="the commit A (default: git merge-base main HEAD)")
    ap.add_argument("--reps", type=int, default=3, help="pairs of children (A and B each run this many times)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each executor in a child")
    ap.add_argument("--client-fraction", type=float, default=0.25)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA", str(ROOT.parent / "shared" / "datasets")))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.reps < 1 or args.rounds < 1 or not 0 < args.client_fraction <= 1:
        sys.exit("error: --reps and --rounds must be at least 1 and --client-fraction in (0, 1]")
    sys.stdout.reconfigure(line_buffering=True)
    base = args.base or git("merge-base", "main", "HEAD")
    head = git("rev-parse", "--short", "HEAD")
    dirty = " (+ uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    overrides = [f"training.client_fraction={args.client_fraction}", f"training.precision={args.precision}",
                 "device=cpu", *args.sets]  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="vectorized_ab-"))
    trees = {"A": tmp / "base", "B": ROOT}
    git("worktree", "add", "--detach", str(trees["A"]), base)
    results: dict[str, list[dict]] = {"A": [], "B": []}
    try:
        for i in range(args.reps):
            for which in ("A", "B") if i % 2 == 0 else ("B", "A"):
                r = child(trees[which], overrides, args.rounds, args.data_root)
                results[which].append(r)
                s = r["s_per_round"]
                print(f"pair {i + 1} {which}: sequential {s['sequential']:.3f} s/round, vectorized {s['vectorized']:.3f} "
                      f"s/round, speed-up {r['speedup']:.2f}× (batched {r['executor']['updates_batched']}, one at a time "
                      f"{r['executor']['updates_one_at_a_time']})")  # fmt: skip
    finally:
        git("worktree", "remove", "--force", str(trees["A"]))
    med = {w: statistics.median(r["speedup"] for r in rs) for w, rs in results.items()}
    print(f"config {CONFIG} {' '.join(overrides)}; {args.rounds} timed rounds per executor per child, 1 thread")
    ups = {w: ", ".join(f"{r['speedup']:.2f}" for r in rs) for w, rs in results.items()}
    print(f"A ({base[:7]}): speed-ups {ups['A']}; median {med['A']:.2f}×")
    print(f"B ({head}{dirty}): speed-ups {ups['B']}; median {med['B']:.2f}×")
    print(f"ratio B/A of the median speed-ups: {med['B'] / med['A']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"base": base, "head": head, "overrides": overrides, "results": results,
                                               "median_speedup": med}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
