"""Sequential vs vectorised executor: seconds per round, training GFLOP/s against this machine's matmul rate, and
how the cost grows with the number of clients — every ratio measured in the same run.

    python benchmarks/executors.py [--precisions fp32,bf16] [--rounds 3] [--scaling 10,40,159,1000]
                                   [--skip-bibtex] [--device cpu|cuda] [--json FILE]

* **Machine**: the rate of one 1024 × 1024 × 1024 matrix product (and of a 32-row one, a client batch's shape) in
  fp32 and bf16, on this process's torch threads or (``--device cuda``) on the GPU, where an 8192³ product's rate
  is printed too (the 1024-wide one does not fill a large GPU). Ratios are taken against the 1024-wide rate.
* **Bibtex FedALC** (``experiments/configs/bibtex_fedalc.yaml``: all 159 clients every round, the paper's
  512 → 1024 → 1024 → 512 network; needs ``$SECURE_FED_DATA``): seconds per round of each executor at each
  precision (mean of ``--rounds`` rounds after one warm-up, the two executors' rounds interleaved), their
  ratio, the 300-round time it implies, and the training GFLOP/s of each (the round's forward, input-gradient
  and weight-gradient products counted from the network's shape and the clients' example counts) over the matmul
  rate at the same precision.
* **Scaling**: synthetic positive-only data with C labels (one client per label, 20 instances per label, dense
  64-wide features, the same 1024-wide body; label groups of about 32 labels and about 1.6 noise labels an
  instance, so an instance holds about 12 labels, and a client about as many examples, from 40 clients up),
  seconds per round of both executors at each C.

The per-round time is wall time of ``Experiment.train_round`` (no evaluation); on CUDA the clock is read after
the device has finished its queued work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
BIBTEX = REPO / "experiments/configs/bibtex_fedalc.yaml"
EXECUTORS = ("sequential", "vectorized")


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_rate(dtype: torch.dtype, m: int, k: int = 1024, n: int = 1024, seconds: float = 0.5, device: str = "cpu") -> float:
    """GFLOP/s of an (m × k) @ (k × n) product (random operands on ``device``), repeated for about ``seconds``."""
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(10):
            a @ b
        reps += 10
        _sync(device)
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


def training_flops(exp) -> float:
    """FLOPs of one round's client training: per example, 2·in·out for each layer's forward product, as much for
    its weight gradient, and as much for its input gradient (not the first layer's, whose input is data)."""
    from secure_fed.algorithms.batched_sgd import linear_chain

    chain = linear_chain(exp.worker)
    if chain is None:
        return float("nan")
    sizes = [m.in_features * m.out_features for m, prefix in chain if prefix is not None]
    per_example = sum(2 * s * (3 if i else 2) for i, s in enumerate(sizes))
    examples = sum(c.num_examples for c in exp.fed.clients) * exp.local.epochs
    return per_example * examples * exp.plan.training.client_fraction


def seconds_per_round(
    config, overrides: list[str], executors: tuple[str, ...], rounds: int, device: str = "cpu"
) -> tuple[dict, dict]:
    """Seconds per round of each executor on the same configuration: one experiment per executor, one warm-up
    round each, then ``rounds`` rounds of each **interleaved** (A B A B …), so that both see the same phases of a
    machine whose speed drifts (this virtual machine's rates move by 10–25% over minutes). Returns the mean seconds
    per round, the experiment and the seconds of each timed round of each executor."""
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment
    from secure_fed.engine.collector import long_lived_frozen

    with tempfile.TemporaryDirectory() as tmp:
        exps = {}
        for ex in executors:
            cfg = load_config(config, [*overrides, f"training.executor={ex}", "output.progress=false", f"device={device}"])
            exps[ex] = Experiment(cfg, run_dir=Path(tmp) / ex)
            exps[ex].setup()
            exps[ex].train_round()  # warm-up
        times: dict[str, list[float]] = {ex: [] for ex in executors}
        with long_lived_frozen():  # as a run's rounds (``Experiment.run_rounds``): set-up objects out of gc's scans
            for _ in range(rounds):
                for ex in executors:
                    _sync(device)
                    t0 = time.perf_counter()
                    exps[ex].train_round()
                    _sync(device)
                    times[ex].append(time.perf_counter() - t0)
    return {ex: statistics.mean(t) for ex, t in times.items()}, exps, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scaling", default="10,40,159,1000", help="numbers of clients of the scaling table ('' to skip)")
    ap.add_argument("--skip-bibtex", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the runs and the matmul rates run")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows as it goes, also into a file
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        sys.exit("error: --device cuda: torch sees no CUDA device")
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    out: dict = {"device": dev, "device_name": name, "threads": torch.get_num_threads(), "machine": {}, "bibtex": {},
                 "scaling": {}}  # fmt: skip

    for prec, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        r = {"gflops_1024": matmul_rate(dt, 1024, device=dev), "gflops_32_rows": matmul_rate(dt, 32, device=dev)}
        if dev == "cuda":
            r["gflops_8192"] = matmul_rate(dt, 8192, 8192, 8192, device=dev)
        out["machine"][prec] = r
    print(f"device: {dev} ({name}); torch threads: {out['threads']}; TF32 matmul: {torch.backends.cuda.matmul.allow_tf32}")
    for prec, r in out["machine"].items():
        big = f"; 8192³ {r['gflops_8192']:.0f} GFLOP/s" if "gflops_8192" in r else ""
        print(f"matmul {prec}: 1024³ {r['gflops_1024']:.0f} GFLOP/s; 32 × 1024 × 1024 {r['gflops_32_rows']:.0f} GFLOP/s{big}",
              flush=True)  # fmt: skip

    if not args.skip_bibtex:
        for prec in [p for p in args.precisions.split(",") if p]:
            row = {}
            secs, exps, rounds = seconds_per_round(BIBTEX, [f"training.precision={prec}"], EXECUTORS, args.rounds, dev)
            for executor in EXECUTORS:
                s, exp = secs[executor], exps[executor]
                flops = training_flops(exp)
                rate = flops / s / 1e9
                row[executor] = {"s_per_round": s, "train_gflops": rate,
                                 "of_matmul_rate": rate / out["machine"][prec]["gflops_1024"],
                                 "minutes_300_rounds": 300 * s / 60}  # fmt: skip
                print(f"bibtex fedalc 159 clients {dev} {prec} {executor:>10}: {s:.3f} s/round "
                      f"({flops / 1e9:.0f} GFLOP → {rate:.0f} GFLOP/s = {rate / out['machine'][prec]['gflops_1024']:.2g}"
                      f" of the {prec} matmul rate); 300 rounds ≈ {300 * s / 60:.1f} min")  # fmt: skip
            row["speedup"] = row["sequential"]["s_per_round"] / row["vectorized"]["s_per_round"]
            # each timed sequential round over the vectorised round right after it: how much the ratio moves in a run
            pairs = [a / b for a, b in zip(rounds["sequential"], rounds["vectorized"], strict=True)]
            row["round_seconds"] = rounds
            row["round_pair_speedups"] = pairs
            print(f"bibtex {prec}: vectorized is {row['speedup']:.2f}× sequential (round by round "
                  f"{min(pairs):.2f}–{max(pairs):.2f}×)")  # fmt: skip
            out["bibtex"][prec] = row

    for n in [int(c) for c in args.scaling.split(",") if c]:
        ov = [f"dataset.synthetic.num_labels={n}", f"dataset.synthetic.num_train={20 * n}",
              f"dataset.synthetic.num_groups={max(1, round(n / 32))}", f"dataset.synthetic.noise_label_rate={min(0.01, 1.6 / n)}",
              "dataset.synthetic.num_test=200",
              "model.hidden_dims=[1024,1024]", "model.embedding_dim=512", "training.client_fraction=1.0"]  # fmt: skip
        row = seconds_per_round(None, ov, EXECUTORS, max(1, args.rounds - 1), dev)[0]
        row["speedup"] = row["sequential"] / row["vectorized"]
        out["scaling"][n] = row
        print(f"synthetic {n:>5} clients: sequential {row['sequential']:.3f} s/round, vectorized "
              f"{row['vectorized']:.3f} s/round ({row['speedup']:.2f}×)")  # fmt: skip

    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
