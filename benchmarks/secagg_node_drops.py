"""SecAgg+ aborts when whole nodes fail: the measured abort rate against the node-level bound.

    python benchmarks/secagg_node_drops.py [--rounds 1000] [--nodes 8 32] [--rates 0.05 0.15 0.3]
        [--stages uniform input] [--engine protocol|predictor] [--clients 40] [--seed 0]

The embedded default's secure aggregation (every one of its 40 clients in every round; ``secure_aggregation`` at its
defaults: the graph ``graph_for`` picks, here the complete graph with t = 24, and the consistency check), with the
clients on N nodes (client c on node c mod N). Each round every node fails with probability p, independently, at a
stage drawn uniformly from advertise/share/input/unmask (``--stages uniform``) or always at ``input`` (the worst case,
where the bound is exact on the complete graph); its clients drop from that stage on, as a fault schedule drops them.

``--engine protocol`` runs each round through :func:`protocols.secagg.protocol.secure_sum` (the real protocol: keys,
shares, masks, signatures) and also asks :func:`protocols.secagg.abort_prediction.predict_round`, counting where
they differ (they must not); ``predictor`` decides each round by the predictor alone (milliseconds a round, for
tight intervals). Per cell: aborts / rounds, the Clopper–Pearson 95% interval, the node-level bound
(:func:`protocols.secagg.graph_bounds.node_abort_bound`) and the client-level bound with each client dropping at the
marginal rate p (what the graph's bounds give for independent drops; not valid for node drops). ``within`` says
whether the interval's lower end is at most the node-level bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from scipy.stats import beta  # noqa: E402

from protocols.config_sections import SecureAggregationConfig  # noqa: E402
from protocols.secagg.abort_prediction import abort_stage, predict_round  # noqa: E402
from protocols.secagg.fault_schedule import STAGES  # noqa: E402
from protocols.secagg.graph_bounds import (  # noqa: E402
    abort_drops,
    binom_tail,
    failure_bounds,
    graph_for,
    node_abort_bound,
    node_loads,
)
from protocols.secagg.protocol import SecAggAbort, neighbour_graph, secure_sum  # noqa: E402


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) two-sided interval for a binomial proportion k / n."""
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def node_drops(rng: np.random.Generator, clients: int, nodes: int, p: float, stages: str) -> dict[str, set[int]]:
    """One round's dropped sets: each node fails with probability p (at a uniform stage, or at ``input``); its
    clients drop from that stage on (the shape of a fault schedule's :meth:`FaultSchedule.drops`)."""
    out = {s: set() for s in STAGES}
    for v in range(nodes):
        if rng.random() < p:
            stage = STAGES[int(rng.integers(len(STAGES)))] if stages == "uniform" else "input"
            for s in STAGES[STAGES.index(stage) :]:
                out[s].update(range(v, clients, nodes))
    return out


def client_level_bound(n: int, k: int | None, threshold: float, p: float) -> float:
    """The graph's abort bound for independent client drops at rate p (graph_bounds, the checked server)."""
    if k is None or k >= n - 1:
        from protocols.secagg.protocol import threshold_for

        return binom_tail(n, p, abort_drops(n, threshold_for(n, threshold), server="checked"))
    return failure_bounds(n, k, threshold=threshold, corrupt_fraction=0.0, dropout=p, server="checked")[1]


def measure(*, clients: int, nodes: int, p: float, stages: str, rounds: int, engine: str, seed: int,
            section: SecureAggregationConfig | None = None) -> dict:  # fmt: skip
    """One cell: ``rounds`` rounds; returns the counts, the interval and both bounds."""
    section = section or SecureAggregationConfig()
    choice = graph_for(clients, section, population=clients)
    t, k = choice.threshold, choice.neighbors
    cohort = list(range(clients))
    inputs = {u: np.array([u + 1], dtype=np.uint64) for u in cohort}
    rng = np.random.default_rng([seed, nodes, int(round(p * 1000)), stages == "input"])
    aborts = mismatches = 0
    t0 = time.perf_counter()
    for r in range(rounds):
        drops = node_drops(rng, clients, nodes, p, stages)
        graph_seed = int(rng.integers(2**31))
        graph = neighbour_graph(cohort, k, graph_seed)
        pred = predict_round(graph, t, drops, consistency_check=section.consistency_check)
        if engine == "protocol":
            try:
                _, u3, _ = secure_sum(inputs, threshold=t, neighbors=k, graph_seed=graph_seed, drop=drops, round_idx=r,
                                      consistency_check=section.consistency_check)  # fmt: skip
                done, stage, summed = True, None, frozenset(u3)
            except SecAggAbort as e:
                done, stage, summed = False, abort_stage(str(e)), frozenset()
            mismatches += (done, stage, summed) != (pred.completes, pred.stage, pred.summed)
        else:
            done = pred.completes
        aborts += not done
    lo, hi = clopper_pearson(aborts, rounds)
    bound = node_abort_bound(clients, k, threshold=section.threshold, node_dropout=p, loads=node_loads(cohort, nodes),
                             server="checked" if section.consistency_check else "unchecked")  # fmt: skip
    return {"clients": clients, "nodes": nodes, "p": p, "stages": stages, "engine": engine, "rounds": rounds,
            "aborts": aborts, "rate": aborts / rounds, "ci": (lo, hi), "node_bound": bound,
            "client_bound": client_level_bound(clients, k, section.threshold, p), "within": lo <= bound,
            "mismatches": mismatches if engine == "protocol" else None, "graph": "complete" if k is None else f"k={k}",
            "t": t, "seconds": time.perf_counter() - t0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.15, 0.3])
    ap.add_argument("--stages", nargs="+", choices=["uniform", "input"], default=["uniform", "input"])
    ap.add_argument("--engine", choices=["protocol", "predictor"], default="protocol")
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print("| nodes | p | node fails at | graph, t | rounds | aborts | rate | 95% CI (Clopper–Pearson) | node-level bound "
          "| client-level bound | within | protocol ≠ prediction | s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ok = True
    for nodes in args.nodes:
        for stages in args.stages:
            for p in args.rates:
                m = measure(clients=args.clients, nodes=nodes, p=p, stages=stages, rounds=args.rounds,
                            engine=args.engine, seed=args.seed)  # fmt: skip
                ok &= m["within"] and not m["mismatches"]
                mis = "—" if m["mismatches"] is None else str(m["mismatches"])
                print(f"| {nodes} | {p:g} | {stages} | {m['graph']}, {m['t']} | {m['rounds']} | {m['aborts']} | "
                      f"{m['rate']:.4f} | [{m['ci'][0]:.4f}, {m['ci'][1]:.4f}] | {m['node_bound']:.4f} | "
                      f"{m['client_bound']:.4f} | {'yes' if m['within'] else 'NO'} | {mis} | {m['seconds']:.0f} |",
                      flush=True)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
