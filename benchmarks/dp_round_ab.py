"""Benchmark: one Bibtex DP round, the previous commit against this checkout, alternating subprocess runs.

    python benchmarks/dp_round_ab.py [--base COMMIT] [--reps 5] [--config experiments/configs/bibtex_private.yaml]
                                     [--set KEY=VALUE ...] [--data-root DIR] [--keep-worktree]

A git worktree of ``--base`` (default: ``main``'s merge base with HEAD, the commit this branch started from) is made
in a temporary folder; then ``--reps`` pairs of ``secure-fed run CONFIG`` subprocesses run, old and new alternating
(old first in even pairs, new first in odd ones, so drift on a shared machine falls on both), each with
``PYTHONPATH`` set to its own tree and one thread (``OMP_NUM_THREADS=1``), each timed by the wall clock from its start
to its exit (start-up, data loading, the round, the report). Prints every time, both medians and the ratio
new/old. The default config, ``bibtex_private.yaml``, is one round of FedALC on Bibtex with the server's W step
(DP-SGD over label sets) and DP-SGD in client training: both sums before the snap that ``protocols.dp.exact_sums``
changed. ``--set`` passes overrides to both runs (e.g. ``privacy.local.noise=shares`` and its requirements).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def timed_run(tree: Path, config: str, sets: list[str], data_root: str, out: Path) -> float:
    """Wall-clock seconds of one ``secure-fed run`` subprocess on ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "SECURE_FED_DATA": data_root}
    cmd = [sys.executable, "-m", "secure_fed.cli", "run", str(tree / config), "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"error: the run on {tree} failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=None, help="the previous commit (default: git merge-base main HEAD)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--config", default="experiments/configs/bibtex_private.yaml")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA", str(ROOT.parent / "shared" / "datasets")))
    ap.add_argument("--keep-worktree", action="store_true")
    args = ap.parse_args()
    base = args.base or git("merge-base", "main", "HEAD")
    head = git("rev-parse", "--short", "HEAD")
    dirty = " (+ uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else ""
    tmp = Path(tempfile.mkdtemp(prefix="dp_round_ab-"))
    old_tree = tmp / "base"
    git("worktree", "add", "--detach", str(old_tree), base)
    try:
        times: dict[str, list[float]] = {"old": [], "new": []}
        trees = {"old": old_tree, "new": ROOT}
        for i in range(args.reps):
            for which in ("old", "new") if i % 2 == 0 else ("new", "old"):
                dt = timed_run(trees[which], args.config, args.sets, args.data_root, tmp / f"{which}-{i}")
                times[which].append(dt)
                print(f"pair {i + 1}: {which} {dt:.2f} s", flush=True)
        old, new = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"config {args.config} {' '.join(args.sets)}")
        print(f"old ({base[:7]}): {', '.join(f'{t:.2f}' for t in times['old'])} s; median {old:.2f} s")
        print(f"new ({head}{dirty}): {', '.join(f'{t:.2f}' for t in times['new'])} s; median {new:.2f} s")
        print(f"ratio new/old (medians): {new / old:.3f}")
    finally:
        if not args.keep_worktree:
            git("worktree", "remove", "--force", str(old_tree))


if __name__ == "__main__":
    main()
