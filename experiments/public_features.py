"""Public features from public metadata, measured against the random projection (issue 55), on a validation split.

    python experiments/public_features.py [--dataset bibtex] [--seeds 0,1,2] [--epsilons 1,4,8,inf]
                                          [--out results/private_recipes/public_features] [--data-root DIR]

The Mulan files' attribute names (for Bibtex, the vocabulary's words) are public, so a fixed encoder built from them
is data-independent: each word is embedded with the offline text encoder the project ships for FedLGT
(``all-MiniLM-L6-v2``, ``HF_HUB_OFFLINE=1``) and an instance becomes the mean of its words' embeddings (384 numbers).
This script measures that encoder against the two the recipe can use, on the recipe's mechanism:

* ``random_512``: a fixed random projection like the recipe's encoder (``experiments/configs/bibtex_private.yaml``:
  orthogonal, 1836 → 1024), here a Gaussian 1836 → 512 matrix;
* ``raw``: the input itself (each row scaled to unit norm: rsqrt_nnz on 0/1 data);
* ``words``: the mean of the words' text embeddings, unit norm;
* ``raw+words``: both, concatenated with equal weight, unit norm.

The mechanism is the recipe's one noisy step, simulated in numpy: every training instance counts for at most m = 2 of
its labels (the others dropped at random, as the keyed rule drops them), each class row is the sum of its instances'
unit-norm feature vectors plus Gaussian noise of std σ per coordinate, σ calibrated with the project's own
:func:`protocols.dp.accountant.calibrate_sigma` (q = 1, m steps, δ = 1e-5, RDP), and a row scores an instance by
their cosine (FedALC normalises its rows). It leaves out what the run adds around that step (the initial row, the
loss's gradient shape, the W step's own small charge), so its figures are the mechanism's, not a run's; the test
split is never read (a validation split: 20% of the training split, ``dataset.split_seed`` 0). Writes
``OUT/table.md`` and ``OUT/results.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from protocols.dp.accountant import calibrate_sigma
from secure_fed.config import load_plan
from secure_fed.data.from_config import build_dataset
from secure_fed.metrics import evaluate_scores

M, DELTA, CONFIG = 2, 1e-5, "experiments/configs/bibtex_private.yaml"


def unit_rows(a: np.ndarray) -> np.ndarray:
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)


def attribute_names(path: Path, width: int) -> list[str]:
    """The feature attributes' names of a Mulan ARFF file (the first ``width`` attributes: the labels follow them)."""
    names = [line.split()[1].strip("'\"") for line in path.open() if line.lower().startswith("@attribute")]
    return names[:width]


def encoders(x: sp.csr_matrix, names: list[str], rng: np.random.Generator) -> dict[str, callable]:
    from secure_fed.models.text_encoder import load_text_encoder

    emb = unit_rows(np.asarray(load_text_encoder("all-MiniLM-L6-v2").encode(names), dtype=np.float64))
    proj = rng.standard_normal((x.shape[1], 512)) / math.sqrt(512)

    def raw(a):
        return unit_rows(a.toarray())

    def words(a):
        return unit_rows(np.asarray(raw(a) @ emb))

    return {"random_512": lambda a: unit_rows(raw(a) @ proj), "raw": raw, "words": words,
            "raw+words": lambda a: unit_rows(np.hstack([raw(a), words(a)]))}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="bibtex")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epsilons", default="1,4,8,inf")
    ap.add_argument("--out", default="results/private_recipes/public_features")
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    plan = load_plan(CONFIG, [f"dataset.name={args.dataset}", "dataset.evaluate_on=validation"])
    ds = build_dataset(plan, args.data_root)
    x, y = sp.csr_matrix(ds.train.features, dtype=np.float64), ds.train.labels.toarray()
    xv, yv = sp.csr_matrix(ds.test.features, dtype=np.float64), ds.test.labels.toarray()  # the validation rows
    root = Path(args.data_root or "") / "mulan" / args.dataset
    names = attribute_names(root / f"{args.dataset}-train.arff", x.shape[1])
    epsilons = [float(e) for e in args.epsilons.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    sigma = {e: (calibrate_sigma(target_epsilon=e, delta=DELTA, sample_rate=1.0, steps=M, accountant="rdp")
                 if math.isfinite(e) else 0.0) for e in epsilons}  # fmt: skip
    results: dict[str, dict[str, list[list[float]]]] = {}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        kept = y.astype(np.float64).copy()
        for i in np.flatnonzero(y.sum(1) > M):  # the bound: m labels per instance, the others dropped at random
            kept[i, rng.choice(np.flatnonzero(y[i]), int(y[i].sum()) - M, replace=False)] = 0
        for name, enc in encoders(x, names, np.random.default_rng(1000 + seed)).items():
            f, fv = enc(x), enc(xv)
            sums = f.T @ kept
            for e in epsilons:
                rows = sums + sigma[e] * rng.standard_normal(sums.shape)
                scores = fv @ (rows / np.maximum(np.linalg.norm(rows, axis=0), 1e-12))
                ev = evaluate_scores(scores, yv, ks=(1, 3))
                results.setdefault(name, {}).setdefault(f"{e:g}", []).append([ev["P@1"], ev["P@3"], ev["mAP"]])
            print(f"seed {seed} {name}: done", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cols = [f"{e:g}" for e in epsilons]
    lines = ["P@1 / P@3 / mAP on the validation split, mean over seeds " + args.seeds, "",
             "| features | " + " | ".join(f"ε = {c}" for c in cols) + " |", "| --- |" + " --- |" * len(cols)]  # fmt: skip
    for name, by_eps in results.items():
        cells = [" / ".join(f"{v:.1f}" for v in np.mean(by_eps[c], axis=0)) for c in cols]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"sigma": {f"{e:g}": s for e, s in sigma.items()}, "m": M,
                                                  "results": results}, indent=1))  # fmt: skip
    print("\n".join(lines))


if __name__ == "__main__":
    main()
