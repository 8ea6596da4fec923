"""Seconds per round in process and on Flower's simulation engine, measured in the same run, and their ratio.

    python benchmarks/flower_overhead.py [--cases default,bibtex] [--rounds 5] [--json FILE]

``default`` is the embedded default (FedALC, 40 clients); ``bibtex`` is FedALC on Bibtex with all 159 clients every
round (``experiments/configs/bibtex_fedalc.yaml``, needs the Mulan data in ``$SECURE_FED_DATA``). Each case runs
``--rounds`` rounds both ways from the same seed; the per-round time is the training wall time of rounds 2…R (the
first round on Flower also starts the Ray actors and builds each actor's copy of the run, reported apart as
start-up). The final metrics of the two runs are compared too (they must agree).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "default": (None, []),
    "bibtex": (REPO / "experiments/configs/bibtex_fedalc.yaml", ["training.client_fraction=1.0"]),
}


def measure(config, overrides: list[str], rounds: int, backend: str, out: Path) -> dict:
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    cfg = load_config(config, [*overrides, f"training.rounds={rounds}", f"backend={backend}",
                               f"evaluation.every={rounds}", "output.checkpoint_every=1000000"])  # fmt: skip
    t0 = time.perf_counter()
    exp = Experiment(cfg, run_dir=out / backend)
    built = time.perf_counter() - t0
    result = exp.run(progress=False)
    total = time.perf_counter() - t0
    walls = [d["wall_seconds"] for d in exp.diagnostics]
    per_round = (walls[-1] - walls[0]) / (len(walls) - 1) if len(walls) > 1 else float("nan")
    return {"build_s": built, "total_s": total, "first_round_s": walls[0], "s_per_round": per_round,
            "final": result.summary["final"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="default,bibtex")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = {}
    for case in args.cases.split(","):
        config, overrides = CASES[case]
        with tempfile.TemporaryDirectory() as tmp:
            local = measure(config, overrides, args.rounds, "inprocess", Path(tmp))
            flower = measure(config, overrides, args.rounds, "flower", Path(tmp))
        diff = max(abs(local["final"][k] - flower["final"][k]) for k in local["final"])
        rows[case] = {"inprocess": local, "flower": flower, "ratio": flower["s_per_round"] / local["s_per_round"],
                      "max_final_metric_difference": diff}  # fmt: skip
        print(f"{case}: in process {local['s_per_round']:.3f} s/round, Flower {flower['s_per_round']:.3f} s/round "
              f"(×{rows[case]['ratio']:.2f}); Flower's first round {flower['first_round_s']:.1f} s, whole run "
              f"{flower['total_s']:.1f} s against {local['total_s']:.1f} s; final metrics differ by {diff:.2g}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
