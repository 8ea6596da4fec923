"""Non-private upper bounds of the levers left to the Bibtex private recipe (issue 55), on a validation split.

    python experiments/recipe_upper_bounds.py [--seeds 0,1,2] [--epsilons 1,4,8,inf]
                                              [--out runs/recipe_upper_bounds] [--data-root DIR]

Each lever below would need a DP estimate of something computed from the training data. Before building that
estimate, this script measures what the lever could give **at best**: it feeds the lever the exact, non-private
statistic, so the figures bound from above what a DP version charged in the same ledger could reach. Every run is the
shipped recipe (``experiments/configs/bibtex_private.yaml``, FedALC, one noisy round over a fixed encoder) scored on
the validation split (``dataset.evaluate_on=validation``: 20% of the training split, ``dataset.split_seed`` 0); the
test split is never read. ε = ∞ is the same config without the dp layer. The released ε of every run is the recipe's;
the statistics the levers read are **not** charged anywhere.

* ``recipe``: the shipped recipe as it is (orthogonal projection 1836 → 1024, m = 8 with the clip split over an
  instance's copies, rows without their shared direction, scores centred per row); every lever below keeps the
  recipe's scoring.
* ``pca256``: the fixed encoder replaced by the top 256 principal directions of the training inputs (the uncentred
  second moment XᵀX of the preprocessed training rows, each instance once): what a DP-PCA encoder could reach at best.
* ``low-rank r``: the recipe's class rows W truncated to their top r singular directions (then renormalised):
  denoising by a low-rank prior, which needs no statistic (included because it is the usual first try).
* ``prior β``: the score plus β·log n_c, n_c the exact number of training instances with label c: what an explicit
  label prior from a DP histogram of label counts could reach at best.
* ``co-occurrence λ``: scores smoothed with the exact label co-occurrence matrix A (row-normalised, zero diagonal),
  (1 − λ)·S + λ·S·Aᵀ: what a DP co-occurrence estimate could reach at best.
* ``prior+co-occurrence β, λ``: both, the prior added to the smoothed scores; and each of the three on the PCA
  encoder.

The statistics (PCA, counts, co-occurrence) are read from the training split itself, every label of every instance:
not from the clients' data, which the dp layer bounds to m labels per instance. For the levers with a setting (β, λ,
r) every setting's metrics per seed are in ``OUT/results.json``; the tables show, per ε, the setting with the highest
mean P@1 (first table) or mean mAP (second) on this same validation split (best of grid, so optimistic once more).
The validation metrics are the only ones read: the test split is loaded with the data set but never used. Writes
``OUT/table.md`` and ``OUT/results.json`` (with the singular values of the recipe's W); each run's directory is
under ``OUT/runs``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from secure_fed.config import load_plan
from secure_fed.engine import Experiment
from secure_fed.engine.evaluation import model_scores, scoring_rows
from secure_fed.metrics import center_rows, evaluate_scores

CONFIG = "experiments/configs/bibtex_private.yaml"
PCA_DIM = 256
BETAS = (-0.08, -0.05, -0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.03)
LAMBDAS = (0.1, 0.3, 0.5, 0.7, 0.9)
RANKS = (50, 120)


def metrics(scores: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """P@1, P@3 and mAP (from the row-centred scores, as the shipped recipe scores them)."""
    ev = evaluate_scores(center_rows(scores), y, ks=(1, 3), threshold=0.5, threshold_scores=scores)
    return ev["P@1"], ev["P@3"], ev["mAP"]


def set_pca_encoder(exp: Experiment, dim: int) -> None:
    """Replace the fixed encoder by the top ``dim`` principal directions of the preprocessed training inputs."""
    x = sp.csr_matrix(exp.fed.preprocessor.transform_sparse(sp.csr_matrix(exp.dataset.train.features)))
    second_moment = (x.T @ x).toarray().astype(np.float64) / x.shape[0]
    _, vecs = np.linalg.eigh(second_moment)
    top = vecs[:, ::-1][:, :dim]
    enc = exp.model.encoder
    with torch.no_grad():
        enc.embed.weight.copy_(torch.from_numpy(top.T.copy()).float())
        enc.body[0].weight.copy_(torch.eye(dim))
        enc.body[0].bias.zero_()


def label_statistics(y_train: sp.spmatrix) -> tuple[np.ndarray, np.ndarray]:
    """The exact label counts n_c and the row-normalised co-occurrence matrix A (zero diagonal; a label that never
    co-occurs keeps a zero row) of the (n, C) 0/1 training label matrix."""
    y = sp.csr_matrix(y_train, dtype=np.float64)
    counts = np.asarray(y.sum(axis=0)).ravel()
    co = (y.T @ y).toarray()
    np.fill_diagonal(co, 0.0)
    return counts, co / np.maximum(co.sum(axis=1, keepdims=True), 1.0)


def with_prior(raw: np.ndarray, counts: np.ndarray, beta: float) -> np.ndarray:
    """Scores plus β·log n_c (a label with no training instance counts as 1)."""
    return raw + beta * np.log(np.maximum(counts, 1.0))[None, :]


def smoothed(raw: np.ndarray, a: np.ndarray, lam: float) -> np.ndarray:
    """(1 − λ)·S + λ·S·Aᵀ: each label's score mixed with its co-occurring labels' scores."""
    return (1 - lam) * raw + lam * raw @ a.T


def levers(exp: Experiment, with_low_rank: bool) -> tuple[dict[str, tuple[float, float, float]], list[float]]:
    """Every lever's metrics on the validation rows from one finished run, and W's top singular values."""
    fed, model = exp.fed, exp.model
    if (abs(fed.y_test - sp.csr_matrix(exp.dataset.test.labels))).nnz:
        raise SystemExit("error: the run's label order is not the data set's (a layer permutes it); not supported")
    ev = exp.plan.evaluation  # the recipe's row post-processing (evaluation.remove_shared_direction) applies to every lever
    raw = model_scores(model, model.theta, fed.x_test, scoring_rows(model, ev))
    y = fed.y_test.toarray()
    out = {"base": metrics(raw, y)}
    counts, a = label_statistics(exp.dataset.train.labels)
    for beta in BETAS:
        out[f"prior {beta:g}"] = metrics(with_prior(raw, counts, beta), y)
    for lam in LAMBDAS:
        out[f"co-occurrence {lam:g}"] = metrics(smoothed(raw, a, lam), y)
        for beta in BETAS:
            out[f"prior+co-occurrence {beta:g}, {lam:g}"] = metrics(with_prior(smoothed(raw, a, lam), counts, beta), y)
    w0 = model.W.clone()
    u, s, vt = torch.linalg.svd(w0.double(), full_matrices=False)
    if with_low_rank:
        for r in RANKS:
            model.W = torch.nn.functional.normalize(((u[:, :r] * s[:r]) @ vt[:r]).to(w0.dtype), dim=-1)
            out[f"low-rank {r}"] = metrics(model_scores(model, model.theta, fed.x_test, scoring_rows(model, ev)), y)
        model.W = w0
    return out, s.tolist()


def one_run(encoder: str, eps: str, seed: int, out: Path, data_root: str | None) -> tuple[dict[str, tuple], list[float]]:
    overrides = ["dataset.evaluate_on=validation", f"seed={seed}", "output.checkpoint_every=1000"]
    if encoder == "pca256":
        overrides += [f"model.embedding_dim={PCA_DIM}", f"model.embed_dim={PCA_DIM}"]
    overrides += ["protocols=[]", "privacy={delta: 1.0e-5}"] if eps == "inf" else [f"privacy.local.target_epsilon={eps}"]
    exp = Experiment(load_plan(CONFIG, overrides), run_dir=out / "runs" / f"{encoder}-{eps}-{seed}", data_root=data_root)
    if encoder == "pca256":
        set_pca_encoder(exp, PCA_DIM)
    exp.run(progress=False)
    return levers(exp, with_low_rank=encoder == "recipe")


ROWS = [
    ("recipe", "base", "recipe"),
    ("pca256", "base", "PCA encoder, d = 256"),
    ("recipe", "low-rank", "recipe + low-rank W"),
    ("recipe", "prior", "recipe + exact label prior"),
    ("pca256", "prior", "PCA encoder + exact label prior"),
    ("recipe", "co-occurrence", "recipe + exact co-occurrence"),
    ("pca256", "co-occurrence", "PCA encoder + exact co-occurrence"),
    ("recipe", "prior+co-occurrence", "recipe + exact prior and co-occurrence (β, λ)"),
    ("pca256", "prior+co-occurrence", "PCA encoder + exact prior and co-occurrence (β, λ)"),
]


def table(results: dict, epsilons: list[str], by: int = 0) -> str:
    """Markdown: one row per lever, its setting chosen per ε by the mean over seeds of metric ``by`` (0: P@1, 2:
    mAP; ties, e.g. a prior's settings, which shift each label's scores alike and so leave its AP as it is, go to the
    higher P@1); cells P@1 / P@3 / mAP (setting)."""

    def mean(encoder: str, eps: str, key: str) -> np.ndarray:
        return np.mean([results[encoder][eps][s][key] for s in results[encoder][eps]], axis=0)

    lines = ["| lever | " + " | ".join(f"ε = {e}" for e in epsilons) + " |", "| --- |" + " --- |" * len(epsilons)]
    for encoder, family, name in ROWS:
        cells = []
        for eps in epsilons:
            keys = [k for k in next(iter(results[encoder][eps].values())) if k.split(" ")[0] == family]
            best = max(keys, key=lambda k: (round(mean(encoder, eps, k)[by], 2), mean(encoder, eps, k)[0]))
            p1, p3, m = mean(encoder, eps, best)
            setting = f" ({best.split(' ', 1)[1]})" if " " in best else ""
            cells.append(f"{p1:.1f} / {p3:.1f} / {m:.1f}{setting}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--epsilons", default="1,4,8,inf")
    ap.add_argument("--out", default="runs/recipe_upper_bounds")
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    epsilons = args.epsilons.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    singular: dict = {}
    for encoder in ("recipe", "pca256"):
        for eps in epsilons:
            for seed in seeds:
                print(f"{encoder} ε={eps} seed={seed}", flush=True)
                res, sv = one_run(encoder, eps, seed, out, args.data_root)
                results.setdefault(encoder, {}).setdefault(eps, {})[seed] = res
                singular.setdefault(encoder, {}).setdefault(eps, {})[seed] = sv
    (out / "results.json").write_text(json.dumps({"metrics": results, "W_singular_values": singular}, indent=1))
    md = "Setting chosen by mean P@1:\n\n" + table(results, epsilons, by=0)
    md += "\nSetting chosen by mean mAP:\n\n" + table(results, epsilons, by=2)
    (out / "table.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
