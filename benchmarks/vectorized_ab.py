"""Benchmark: the vectorised executor's speed-up over the sequential one on Bibtex FedALC, the commit this branch
started from (A) against this checkout (B), measured in the same run.

    python benchmarks/vectorized_ab.py [--base COMMIT] [--reps 3] [--rounds 3] [--client-fraction 0.25]
                                       [--precision fp32] [--set KEY=VALUE ...] [--plugin NAME] [--data-root DIR]
                                       [--json FILE]

A git worktree of ``--base`` (default: ``main``'s merge base with HEAD) is made in a temporary folder. Then ``--reps``
pairs of child processes run, A and B alternating (A first in even pairs, B first in odd ones, so drift on a shared
machine falls on both), each with ``PYTHONPATH`` set to its own tree and one thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``). Each child times both executors **in one process** (one experiment per executor, one
warm-up round each, then ``--rounds`` rounds of each interleaved, as ``benchmarks/executors.py`` does) on
``experiments/configs/bibtex_fedalc.yaml`` with ``training.client_fraction`` (default 0.25: about 40 of the 159
clients a round, to keep the whole run within about 5 minutes) and ``--set`` overrides, and reports its speed-up
(sequential s/round ÷ vectorised s/round) by two clocks: the process's CPU time (one thread, so the round's own work;
the figure to read on a shared machine, where other processes stretch the wall clock) and the wall clock. Prints
every child's figures, the median speed-up of A and of B, and their ratio B/A (≥ 1: the vectorised speed-up did not
drop).

``--plugin NAME`` registers one of ``examples/plugins/`` (each tree its own copy, as an installed package's entry
points) so that an algorithm plugin can be timed, e.g. ``--plugin fedprox --set "algorithm={name: fedprox, mu: 0.01}"``
(each child's summary line says how many updates were batched and how many ran one at a time).
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

#: the child: both executors timed in one process on its own tree's code. As ``benchmarks/executors.py``'s
#: ``seconds_per_round``: one experiment per executor, one warm-up round each, then the timed rounds interleaved
#: (sequential, vectorised, sequential, …); each round timed by the wall clock and by the process's CPU time (one
#: thread: the CPU time is the round's own work, which other processes on a shared machine do not stretch)
CHILD = """
import gc, json, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import secure_fed
from secure_fed import config as config_package
from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.engine.collector import long_lived_frozen
tree, config, overrides, rounds = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
assert secure_fed.__file__.startswith(tree), (secure_fed.__file__, tree)
executors = ("sequential", "vectorized")
wall = {ex: [] for ex in executors}
cpu = {ex: [] for ex in executors}
with tempfile.TemporaryDirectory() as tmp:
    exps = {}
    for ex in executors:
        cfg = load_config(tree + "/" + config, [*overrides, f"training.executor={ex}", "output.progress=false"])
        # a tree after issue 54 builds its run from the plan; an older base tree from the config
        run_of = getattr(config_package, "build_plan", lambda c: c)(cfg)
        exps[ex] = Experiment(run_of, run_dir=Path(tmp) / ex)
        exps[ex].setup()
        exps[ex].train_round()  # warm-up
    with long_lived_frozen():
        for _ in range(rounds):
            for ex in executors:
                w0, c0 = time.perf_counter(), time.process_time()
                exps[ex].train_round()
                wall[ex].append(time.perf_counter() - w0)
                cpu[ex].append(time.process_time() - c0)
    report = exps["vectorized"].executor.report()
print(json.dumps({"wall": wall, "cpu": cpu, "executor": report}))
"""


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def write_dist_info(site: Path, project: dict, name: str) -> None:
    """``site/<name>-<version>.dist-info`` holding ``project``'s metadata and entry points, as ``pip install`` would."""
    info = site / f"{name}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "\n".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for g, eps in groups.items())
    )


def register_plugin(tree: Path, name: str, site: Path) -> list[str]:
    """``site/<name>-<version>.dist-info`` with the entry points of ``tree``'s ``examples/plugins/<name>``, as ``pip
    install`` would leave them; returns the path entries that make it importable."""
    import tomllib

    package = tree / "examples" / "plugins" / name
    if not (package / "pyproject.toml").is_file():
        raise SystemExit(f"error: --plugin {name}: no examples/plugins/{name}/pyproject.toml in {tree}")
    write_dist_info(site, tomllib.loads((package / "pyproject.toml").read_text())["project"], name)
    return [str(site), str(package)]


def register_tree(tree: Path, site: Path) -> list[str]:
    """``site/secure_fed-<version>.dist-info`` with ``tree``'s own entry points (its ``pyproject.toml``), so that a base
    tree reads its own plugins' entry points, not those the installed checkout records (which may name modules the
    base does not have); returns the path entry to put after the tree."""
    import tomllib

    write_dist_info(site, tomllib.loads((tree / "pyproject.toml").read_text())["project"], "secure_fed")
    return [str(site)]


def child(tree: Path, overrides: list[str], rounds: int, data_root: str, extra_path: list[str] = ()) -> dict:
    """One child process on ``tree``'s code: both executors' seconds per round, measured in that one process."""
    path = os.pathsep.join([str(tree), *extra_path])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "SECURE_FED_DATA": data_root}
    r = subprocess.run([sys.executable, "-c", CHILD, str(tree), CONFIG, json.dumps(overrides), str(rounds)],
                       cwd=tree, env=env, capture_output=True, text=True)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"error: the child on {tree} failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    for clock in ("wall", "cpu"):
        out[f"{clock}_s_per_round"] = {ex: statistics.mean(t) for ex, t in out[clock].items()}
        out[f"{clock}_speedup"] = out[f"{clock}_s_per_round"]["sequential"] / out[f"{clock}_s_per_round"]["vectorized"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default=None, help="the commit A (default: git merge-base main HEAD)")
    ap.add_argument("--reps", type=int, default=3, help="pairs of children (A and B each run this many times)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each executor in a child")
    ap.add_argument("--client-fraction", type=float, default=0.25)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--plugin", default=None, help="register examples/plugins/NAME in each tree (an algorithm plugin)")
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
        paths = {w: register_plugin(t, args.plugin, tmp / f"site-{w}") if args.plugin else [] for w, t in trees.items()}
        paths["A"] = [*register_tree(trees["A"], tmp / "site-A-tree"), *paths["A"]]
        for i in range(args.reps):
            for which in ("A", "B") if i % 2 == 0 else ("B", "A"):
                r = child(trees[which], overrides, args.rounds, args.data_root, paths[which])
                results[which].append(r)
                w, c = r["wall_s_per_round"], r["cpu_s_per_round"]
                print(f"pair {i + 1} {which}: CPU s/round sequential {c['sequential']:.3f}, vectorized {c['vectorized']:.3f}, "
                      f"speed-up {r['cpu_speedup']:.2f}×; wall {w['sequential']:.3f} / {w['vectorized']:.3f} s, "
                      f"{r['wall_speedup']:.2f}× (batched {r['executor']['updates_batched']}, one at a time "
                      f"{r['executor']['updates_one_at_a_time']})")  # fmt: skip
    finally:
        git("worktree", "remove", "--force", str(trees["A"]))
    print(f"config {CONFIG} {' '.join(overrides)}; {args.rounds} timed rounds per executor per child, 1 thread")
    med = {}
    for clock in ("cpu", "wall"):
        med[clock] = {w: statistics.median(r[f"{clock}_speedup"] for r in rs) for w, rs in results.items()}
        ups = {w: ", ".join(f"{r[f'{clock}_speedup']:.2f}" for r in rs) for w, rs in results.items()}
        ratio = med[clock]["B"] / med[clock]["A"]
        print(f"{clock} clock: A ({base[:7]}) speed-ups {ups['A']}, median {med[clock]['A']:.2f}×; B ({head}{dirty}) "
              f"speed-ups {ups['B']}, median {med[clock]['B']:.2f}×; ratio B/A {ratio:.3f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"base": base, "head": head, "overrides": overrides, "results": results,
                                               "median_speedup": med}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
