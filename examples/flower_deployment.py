"""The same experiment in process and on Flower (``backend: flower``), and how their results compare.

``backend: flower`` runs every client on a Flower SuperNode of Flower's simulation engine (Ray): the server sends
each training job as a Flower message and sums the replies, with the same algorithm, protocol layers and guard on
every message. Both runs here are the embedded default (FedALC, one client per label) with client-level DP at
``--epsilon`` and a fixed ``privacy.noise_seed`` (debugging only: it makes the DP noise repeat, so the two back
ends can be compared draw for draw; a real run leaves it unset). The script prints each run's metrics, their largest
difference, and both ε. At one torch thread in process (as Ray's workers run) the two agree within 1e-5.

Over real machines with TLS: ``secure-fed flower local --nodes 3`` (docs: Running on Flower).

    python examples/flower_deployment.py --out runs/flower-example
    python examples/flower_deployment.py --small --out /tmp/flower-example     # 2 rounds, 8 clients on 4 nodes
"""

from __future__ import annotations

import argparse
from pathlib import Path

import secure_fed

SMALL = {
    "dataset": {"synthetic": {"num_train": 400, "num_test": 200, "num_features": 16, "num_labels": 8, "num_groups": 2}},
    "model": {"embedding_dim": 16, "hidden_dims": [32]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=8.0, help="target ε of the client unit")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=8, help="Flower SuperNodes (client c on node c mod N)")
    parser.add_argument("--small", action="store_true", help="2 rounds of a smaller problem on 4 nodes")
    parser.add_argument("--out", default="runs/flower-example", help="directory for the two runs")
    args = parser.parse_args()
    out = Path(args.out)
    rounds = 2 if args.small else args.rounds
    config = {
        "training": {"rounds": rounds},
        "evaluation": {"every": rounds},
        "output": {"progress": False},
        "protocols": ["dp"],
        "privacy": {"noise_seed": 7, "client": {"clip_norm": 1.0, "target_epsilon": args.epsilon}},
        **(SMALL if args.small else {}),
    }

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each Flower node trains: the client matmuls then sum in the same order
    try:
        local = secure_fed.run(config, run_dir=out / "in-process")
    finally:
        torch.set_num_threads(threads)
    flower = secure_fed.run(
        {**config, "backend": "flower", "flower": {"num_supernodes": 4 if args.small else args.nodes}},
        run_dir=out / "flower",
    )
    print(f"{'metric':>8} {'in process':>11} {'Flower':>11}")
    for k in ("P@1", "P@3", "nDCG@3", "mAP"):
        print(f"{k:>8} {local.metrics[k]:>11.4f} {flower.metrics[k]:>11.4f}")
    diff = max(abs(local.metrics[k] - flower.metrics[k]) for k in local.metrics)
    print(f"largest metric difference: {diff:.2e}")
    eps = [float(r.privacy["units"]["client"]["epsilon"]) for r in (local, flower)]
    print(f"client-unit ε: in process {eps[0]:.3f}, Flower {eps[1]:.3f} (δ = {local.privacy['delta']:g})")
    print(f"status: in process {local.status}, Flower {flower.status}")


if __name__ == "__main__":
    main()
