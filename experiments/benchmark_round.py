"""Benchmark: seconds per federated round on Bibtex with all 159 clients (paper network).

    python experiments/benchmark_round.py [--algorithm fedalc] [--rounds 3] [--precision fp32|bf16]
                                          [--threads N] [--data-root DIR]

Prints the set-up time (data, label-set collection) and the time of each round,
then the mean over the timed rounds (the first round is reported separately as warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algorithm", default="fedalc", choices=["fedavg", "fedavg_fixed", "fedaws", "fedalc", "fedalc_fixed"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_experiment, long_lived_frozen

    plan = load_plan(
        CONFIGS / f"bibtex_{args.algorithm}.yaml",
        [f"training.precision={args.precision}", f"device={args.device}", "output.progress=false"],
    )
    t0 = time.perf_counter()
    exp = build_experiment(plan, run_dir="/tmp/secure-fed-benchmark")
    t1 = time.perf_counter()
    exp.setup()
    t2 = time.perf_counter()
    print(
        f"device {exp.device}, threads {torch.get_num_threads()}, precision {args.precision}, "
        f"{len(exp.fed.clients)} clients, {sum(c.num_examples for c in exp.fed.clients)} client examples per epoch"
    )
    print(f"build {t1 - t0:.2f}s, setup ({args.algorithm}) {t2 - t1:.2f}s")
    times = []
    with contextlib.ExitStack() as frozen:
        for r in range(args.rounds + 1):
            if r == 1:  # after the warm-up, as a run's rounds (``Experiment.run_rounds``): set-up objects out of gc's scans
                frozen.enter_context(long_lived_frozen())
            t = time.perf_counter()
            exp.train_round()
            if exp.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            print(f"round {r + 1}: {times[-1]:.3f}s" + (" (warm-up)" if r == 0 else ""))
    t = time.perf_counter()
    exp.evaluate()
    print(f"evaluation on {exp.fed.x_test.shape[0]} test rows: {time.perf_counter() - t:.3f}s")
    timed = times[1:]
    print(
        f"mean {statistics.mean(timed):.3f}s/round over {len(timed)} rounds "
        f"→ {300 * statistics.mean(timed) / 60:.1f} min for 300 rounds"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
