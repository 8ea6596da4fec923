"""Benchmark: membership inference's K shadow runs, one after another against one vectorised cohort, in one process.

    python experiments/benchmark_shadows.py [--dataset synthetic|bibtex] [--shadows 8 16] [--rounds 5]
                                            [--threads N] [--device cpu|cuda|auto] [--data-root DIR] [--no-recipe]
                                            [--repeat R]

Builds and trains the target once (not timed), then trains the same K shadows (the target's recipe, its seeds and
random halves) three ways, each into a fresh cache:

* ``recipe``: one after another with the recipe's own executor (the default config's ``sequential``: the path an
  audit took before the cohort; ``--no-recipe`` skips it);
* ``one-by-one``: one after another on the vectorised executor (the cohort's numerical reference);
* ``cohort``: all K at once, their clients batched across shadows (``attacks.membership_inference.shadow_cohort``).

Prints each one's seconds (with ``--repeat R``, the ways run R times interleaved and each one's minimum is used: on
a shared machine the least disturbed run), the ratios, and the largest |Δφ| between the cohort's shadow scores and the one-by-one
ones (the float reassociation of batched products; the test is ``tests/threat_models/test_shadow_cohort.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import CONFIGS  # noqa: E402


def _shadow_trainer(e, plan, shadows: int, shadow_dir: Path, cohort: int, executor: str | None):
    from secure_fed.plugin_api.attacks import plan_variant
    from threat_models.attacks.membership_inference import MembershipInference
    from threat_models.attacks_section import attacks_of
    from threat_models.context import AuditContext

    opts = attacks_of(plan).membership_inference.model_copy(
        update={"shadows": shadows, "shadow_dir": str(shadow_dir), "shadow_cohort": cohort}
    )
    aux, _ = MembershipInference(opts).prepare(AuditContext(e))
    sh = aux["shadow"]
    if executor is not None:  # the shadows' recipe with another executor (the same training, another schedule)
        sh.plan = plan_variant(sh.plan, [f"training.executor={executor}"])
    return sh, aux


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", choices=["synthetic", "bibtex"], default="synthetic")
    ap.add_argument("--shadows", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the target and of each shadow")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-root", default=None)
    ap.add_argument("--no-recipe", action="store_true", help="skip the one-after-another run with the recipe's executor")
    ap.add_argument("--repeat", type=int, default=1, help="repeats of the three ways, interleaved; the minimum is reported")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import build_experiment

    over = [f"training.rounds={args.rounds}", f"device={args.device}", "output.progress=false",
            "attacks.run=[membership_inference]", *([f"training.threads={args.threads}"] if args.threads else [])]  # fmt: skip
    path = CONFIGS / "bibtex_fedalc.yaml" if args.dataset == "bibtex" else None
    plan = load_plan(path, over)
    tmp = Path(tempfile.mkdtemp(prefix="secure-fed-shadows-"))
    t = time.perf_counter()
    e = build_experiment(plan, run_dir=tmp / "target", data_root=args.data_root)
    e.run(progress=False)
    print(
        f"{args.dataset}: {plan.algorithm.name}, {len(e.fed.clients)} clients, {args.rounds} rounds, recipe executor "
        f"{plan.training.executor}, device {e.device}, threads {torch.get_num_threads()}; target {time.perf_counter() - t:.1f}s"
    )
    for K in args.shadows:
        times: dict[str, list[float]] = {}
        scores = {}
        ways = [("recipe", 1, None)] if not args.no_recipe else []
        ways += [("one-by-one", 1, "vectorized"), ("cohort", K, None)]
        for rep in range(args.repeat):  # the ways interleaved, each time into a fresh cache
            for name, cohort, executor in ways:
                sh, aux = _shadow_trainer(e, plan, K, tmp / f"K{K}-{name}-{rep}", cohort, executor)
                t = time.perf_counter()
                scores[name], _ = sh.run(aux["encoder"], aux["x"], aux["Y"])
                if e.device.type == "cuda":
                    torch.cuda.synchronize()
                times.setdefault(name, []).append(time.perf_counter() - t)
        each = {n: ", ".join(f"{t:.1f}" for t in ts) for n, ts in times.items()}
        print(f"K = {K}: seconds per repeat: " + "; ".join(f"{n} {v}" for n, v in each.items()))
        times = {n: min(ts) for n, ts in times.items()}  # the least disturbed of the repeats (a shared machine)
        line = ", ".join(f"{n} {s:.1f}s" for n, s in times.items())
        ratios = ", ".join(f"{n}/cohort {times[n] / times['cohort']:.2f}x" for n in times if n != "cohort")
        diff = float(np.abs(scores["cohort"] - scores["one-by-one"]).max())
        print(f"K = {K} (min of {args.repeat}): {line}; {ratios}; max |Δφ| cohort vs one-by-one {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
