"""FedALC's approximate neighbour search against the exact one: recall and seconds, measured in the same run.

    python benchmarks/neighbour_recall.py [--labels 50000] [--dim 512] [--k 50] [--ef 32,64,128] [--hnsw-m 32]
        [--ef-construction 80] [--nprobe 64,256,1024] [--nndescent] [--json FILE]

Two kinds of class-embedding rows W (C × d):

* ``spread init``: the random unit rows every run starts from (``spread_init``). In 512 dimensions their cosines
  all lie near 0, so "nearest" is decided by noise, the hardest case for any index;
* ``clustered``: rows drawn around C/25 random centres (as trained class embeddings of co-occurring labels
  group), each 0.5/√d-perturbed and renormalised.

For each, the exact blocked search (``nearest_classes``) gives N_K(u) for every class; the approximate search
(``approximate_nearest_classes``: faiss IVF, ⌈4√C⌉ lists) runs at each ``--nprobe``, the HNSW graph at each ``--ef``
and, with ``--nndescent``, the NN-descent graph; recall is the share of exact neighbours found, over all C classes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from secure_fed.algorithms.regularizers import approximate_nearest_classes, nearest_classes
from secure_fed.models.encoders import spread_init


def recall(approx: torch.Tensor, exact: torch.Tensor) -> float:
    a, e = approx.numpy(), exact.numpy()
    a.sort(axis=1)
    e.sort(axis=1)
    hits = sum(len(np.intersect1d(x, y, assume_unique=True)) for x, y in zip(a, e, strict=True))
    return hits / e.size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--ef", default="32,64,128")
    ap.add_argument("--hnsw-m", type=int, default=32, help="HNSW links a node (M)")
    ap.add_argument("--ef-construction", type=int, default=80, help="HNSW candidates while inserting")
    ap.add_argument("--nprobe", default="64,256,1024")
    ap.add_argument("--nndescent", action="store_true", help="also the NN-descent graph (ann_index nndescent, one core)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    C, d, k = args.labels, args.dim, args.k
    gen = torch.Generator().manual_seed(0)
    centres = F.normalize(torch.randn(max(1, C // 25), d, generator=gen), dim=-1)
    pick = torch.randint(0, len(centres), (C,), generator=gen)
    kinds = {
        "spread init": spread_init(C, d, generator=gen),
        "clustered": F.normalize(centres[pick] + 0.5 * torch.randn(C, d, generator=gen) / d**0.5, dim=-1),
    }
    out = []
    print(f"{'rows':<12} {'search':<18} {'seconds':>8} {'recall':>7}")
    for name, W in kinds.items():
        t = time.perf_counter()
        exact = nearest_classes(W, k)
        t_exact = time.perf_counter() - t
        print(f"{name:<12} {'exact':<18} {t_exact:>8.1f} {1.0:>7.3f}", flush=True)
        out.append({"rows": name, "search": "exact", "seconds": t_exact, "recall": 1.0})
        settings = [("hnsw", int(x)) for x in args.ef.split(",") if x] + [("ivf", int(x)) for x in args.nprobe.split(",") if x]
        settings += [("nndescent", 0)] if args.nndescent else []
        for index, knob in settings:
            t = time.perf_counter()
            approx = approximate_nearest_classes(W, k, index=index, nprobe=knob, ef_search=knob, hnsw_m=args.hnsw_m,
                                                 ef_construction=args.ef_construction)  # fmt: skip
            dt = time.perf_counter() - t
            r = recall(approx, exact)
            label = {"hnsw": f"hnsw ef {knob}", "ivf": f"ivf nprobe {knob}", "nndescent": "nndescent"}[index]
            print(f"{name:<12} {label:<18} {dt:>8.1f} {r:>7.3f}   ({t_exact / dt:.1f}x faster)", flush=True)
            out.append({"rows": name, "search": label, "seconds": dt, "recall": r})
    if args.json:
        Path(args.json).write_text(json.dumps({"labels": C, "dim": d, "k": k, "results": out}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
