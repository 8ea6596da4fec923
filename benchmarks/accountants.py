"""ε by each registered accountant on a few histories, with the time each takes, cold (nothing cached) and warm.

    python benchmarks/accountants.py [--delta 1e-5] [--fine]

For each (σ, q, steps) history: ε at δ by ``rdp``, ``prv`` and ``pld`` (:mod:`protocols.dp.accountants`) and the
seconds of the first evaluation (the PLD caches emptied first) and of a repeat; ``--fine`` adds dp-accounting's PLD at a
10 times finer grid (1e-5), the check of the stated discretisation (slow: up to a minute a history). Then the time of a
budget check as training makes it with ``pld``: ε after one more step, 20 times in a row (each a new step count).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dp_accounting  # noqa: E402
from dp_accounting.pld import PLDAccountant  # noqa: E402

from protocols.dp.accountants import ACCOUNTANTS, epsilon_of  # noqa: E402
from protocols.dp.accountants import pld as pld_module  # noqa: E402

#: (history, what)
HISTORIES = [
    ([(1.0, 0.1, 100)], "σ 1, q 0.1, 100 steps"),
    ([(1.23, 0.1, 50)], "σ 1.23, q 0.1, 50 steps (the GDP audit's point)"),
    ([(0.8, 0.01, 1000)], "σ 0.8, q 0.01, 1,000 steps"),
    ([(1.484, 0.1, 100), (0.9, 0.25, 400)], "W step (σ 1.484, q 0.1, 100) + DP-SGD (σ 0.9, q 0.25, 400)"),
]


def _clear() -> None:
    for fn in (pld_module.one_step_pld, pld_module.composed_pld, pld_module.pld_epsilon):
        fn.cache_clear()


def _fine(history, delta: float) -> float:
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    acc = PLDAccountant(neighboring_relation=relation, value_discretization_interval=1e-5)
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), n)
              for s, q, n in history]  # fmt: skip
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(delta)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--fine", action="store_true", help="also dp-accounting's PLD at a 1e-5 grid")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # Opacus's notes on the orders it tries; the numbers are what is reported
    names = list(ACCOUNTANTS)
    head = " | ".join(f"{n} ε (cold s, warm s)" for n in names)
    print(f"| history | {head} |" + (" PLD − PLD at a 1e-5 grid |" if args.fine else ""))
    print("|---" * (len(names) + 1 + args.fine) + "|")
    for history, what in HISTORIES:
        _clear()
        cells, eps_by = [], {}
        for name in names:
            t0 = time.perf_counter()
            eps = eps_by[name] = epsilon_of(history, args.delta, name)
            t1 = time.perf_counter()
            epsilon_of(history, args.delta, name)
            t2 = time.perf_counter()
            cells.append(f"{eps:.4f} ({t1 - t0:.2f}, {t2 - t1:.4f})")
        if args.fine:
            cells.append(f"{eps_by['pld'] - _fine(history, args.delta):+.1e}")
        print(f"| {what} | " + " | ".join(cells) + " |")
    _clear()
    sigma, q, n = 1.0, 0.1, 100
    t0 = time.perf_counter()
    for k in range(20):
        epsilon_of([(sigma, q, n + k + 1)], args.delta, "pld")
    print(f"\npld budget checks, σ {sigma}, q {q}, after {n} steps: {(time.perf_counter() - t0) / 20:.2f} s each (20 in a row)")


if __name__ == "__main__":
    main()
