"""Benchmark: the discrete Gaussian noise path against the old floating-point one, A/B in one process.

    python benchmarks/dp_noise.py [--elements 3450000] [--reps 5] [--round | --no-round] [--data-root DIR]

1. **One DP-SGD step's noise** on ``--elements`` coordinates (Bibtex's trained parameters, 3.45M): the old path
   (Box–Muller in float32 from the client's secret stream, N(0, σ²C²) added to the float32 sum) against the new one
   (:meth:`LocalDPSGD.finish`'s: the sum rounded to the grid, γ·Z with Z ~ N_Z, in float64, cast back), the best of
   ``--reps`` each, interleaved.
2. **One Bibtex DP round** (``experiments/configs/bibtex_fedalc_dp.yaml``: instance-level DP-SGD on the server's W
   step), if the data is there (``--data-root``, else ``$SECURE_FED_DATA``, else ``../shared/datasets``): a warm-up
   round, then one round timed with the W step's noise timed inside it; then that noise alone, old (the float64
   Box–Muller draw the layer used before) against new on the same sum; the round ratio is the round's time over the
   same round with the old noise's time in place of the new. A whole-round time varies by more than the noise's
   share on a shared CPU, so the ratio is formed from the parts; ``--ab-rounds N`` also alternates N whole rounds of
   each (the dp layer's ``noisy_sum`` replaced, in this process only, by the old draw). The old float path exists
   only here: no configuration reaches it.

Prints ``ratio new/old`` for each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocols.dp.local_dpsgd import LocalDPSGD  # noqa: E402
from protocols.randomness import SecretStream  # noqa: E402


def old_dp_sgd_noise(sums: dict[str, torch.Tensor], *, std: float, divisor: float, stream: SecretStream, label: str):
    """The replaced path (before issue 43): float32 Box–Muller noise N(0, std²) added to the float32 sums."""
    names = sorted(sums)
    z = stream.gaussian((sum(sums[n].numel() for n in names),), label, dtype=torch.float32)
    out, at = {}, 0
    for n in names:
        s, k = sums[n], sums[n].numel()
        out[n] = (s + (std * z[at : at + k]).to(s.dtype).reshape(s.shape)) / divisor
        at += k
    return out


def old_noisy_sum(total: torch.Tensor, *, sigma: float, sensitivity: float, stream: SecretStream, label: str):
    """The replaced W-step noise: float64 Box–Muller N(0, (σΔ)²) added to the sum."""
    return total + sigma * sensitivity * stream.gaussian(tuple(total.shape), label).to(total.device, total.dtype)


def bench_dp_sgd(elements: int, reps: int) -> float:
    stream = SecretStream.fresh()
    # Bibtex's sparse_text network: a 1836×1024 input layer, 1024×1024, 1024×512 and biases ≈ 3.45M
    sums = {"w": torch.randn(elements - 4096) * 0.1, "b": torch.randn(4096) * 0.1}
    priv = LocalDPSGD(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.01, divisor=32.0, stream=stream, label="bench")
    old_t, new_t = [], []
    for r in range(reps):
        t = time.perf_counter()
        old_dp_sgd_noise(sums, std=1.0, divisor=32.0, stream=stream, label=f"old {r}")
        old_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        priv.finish(sums, f"new {r}")
        new_t.append(time.perf_counter() - t)
    old, new = min(old_t), min(new_t)
    print(f"DP-SGD step noise on {elements:,} coordinates (best of {reps}): old Box–Muller float32 {old * 1e3:.1f} ms, "
          f"new discrete Gaussian on the grid {new * 1e3:.1f} ms; ratio new/old {new / old:.2f}")  # fmt: skip
    return new / old


def bench_round(data_root: str, ab_rounds: int, reps: int) -> float:
    from protocols.dp import w_step_release
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    cfg = load_config(ROOT / "experiments" / "configs" / "bibtex_fedalc_dp.yaml", ["device=cpu", "output.progress=false"])
    exp = Experiment(cfg, run_dir="/tmp/secure-fed-dp-noise-benchmark", data_root=data_root)
    exp.setup()
    new_noise = w_step_release.noisy_sum
    calls: list[tuple[torch.Tensor, dict, float]] = []

    def timed(total, **kw):  # the W step's noise, timed inside the round
        t = time.perf_counter()
        out = new_noise(total, **kw)
        calls.append((total.clone(), kw, time.perf_counter() - t))
        return out

    w_step_release.noisy_sum = timed
    try:
        exp.train_round()  # warm-up (label-set collection, first allocations)
        calls.clear()
        t = time.perf_counter()
        exp.train_round()
        round_s = time.perf_counter() - t
        total, kw, in_round = calls[-1]
        # the noise alone, A/B on this round's W-step sum (best of ``reps`` each, interleaved)
        old_t, new_t = [], []
        for _ in range(reps):
            t = time.perf_counter()
            old_noisy_sum(total, **kw)
            old_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            new_noise(total, **kw)
            new_t.append(time.perf_counter() - t)
        old, new = min(old_t), min(new_t)
        implied = round_s / (round_s - in_round + old)
        print(f"Bibtex DP round (bibtex_fedalc_dp.yaml, threads {torch.get_num_threads()}): {round_s:.2f}s with the new "
              f"noise, of which the W step's noise {in_round * 1e3:.1f} ms ({tuple(total.shape)} coordinates); noise alone "
              f"(best of {reps}): old {old * 1e3:.2f} ms, new {new * 1e3:.2f} ms; round ratio new/old {implied:.4f} "
              "(the round with the old noise's time in place of the new)")  # fmt: skip
        times: dict[str, list[float]] = {"new": [], "old": []}
        for r in range(2 * ab_rounds):  # optional whole-round A/B (noisy under a shared CPU)
            which = "old" if r % 2 == 0 else "new"
            w_step_release.noisy_sum = new_noise if which == "new" else old_noisy_sum
            t = time.perf_counter()
            exp.train_round()
            times[which].append(time.perf_counter() - t)
            print(f"  round with the {which} noise: {times[which][-1]:.2f}s")
        if ab_rounds:
            a, b = statistics.mean(times["new"]), statistics.mean(times["old"])
            print(f"whole rounds, alternating: new {a:.2f}s, old {b:.2f}s (means of {ab_rounds}); ratio new/old {a / b:.3f}")
    finally:
        w_step_release.noisy_sum = new_noise
    return implied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=int, default=3_450_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ab-rounds", type=int, default=0, help="also time whole Bibtex rounds, this many of each path")
    ap.add_argument("--round", action=argparse.BooleanOptionalAction, default=True, help="run the Bibtex round A/B")
    ap.add_argument("--data-root", default=None)
    args = ap.parse_args(argv)
    bench_dp_sgd(args.elements, args.reps)
    if args.round:
        root = args.data_root or os.environ.get("SECURE_FED_DATA") or str(ROOT.parent / "shared" / "datasets")
        if not (Path(root) / "mulan" / "bibtex").exists():
            print(f"Bibtex round A/B skipped: no {root}/mulan/bibtex")
        else:
            bench_round(root, args.ab_rounds, max(args.reps, 20))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
