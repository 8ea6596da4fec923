"""How heterogeneous a partition is: client sizes, label distributions and their pairwise KL divergence.

Following the FLAG/CMDA paper (§4.3, Fig. 3), client ``i``'s label distribution is its positive-label counts
divided by its total positive-label count, ``p_i[l] = sum_n y_n[l] / sum_n sum_l' y_n[l']``, and clients are
compared by the Kullback–Leibler divergence ``KL(p_i || p_j) = sum_l p_i[l] ln(p_i[l] / p_j[l])`` (nats).

Smoothing: a label a client never sees would make KL infinite, so every distribution is smoothed first,
``p~ = (p + eps) / (1 + L * eps)`` with ``eps = EPSILON`` (1e-6). A client with no positive label at all
gets the uniform distribution after smoothing and is listed under ``clients_without_labels``.

Total: the paper reports "the total clients' KL divergence" without defining it; here ``kl_total`` is the
sum over ordered pairs ``i != j`` of ``KL(p_i || p_j)``, and ``kl_mean`` that sum over ``K (K - 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from secure_fed.data.partitions.base import ClientShard

#: additive smoothing of the label distributions before KL (see the module docstring)
EPSILON = 1e-6

KL_DEFINITION = (
    "KL(p_i || p_j) = sum_l p_i[l] ln(p_i[l] / p_j[l]) in nats, p_i = client i's positive-label counts / its total "
    "positive-label count, smoothed as (p + eps) / (1 + L eps); kl_total = sum over ordered pairs i != j; "
    "kl_mean = kl_total / (K (K - 1))"
)


def label_counts(label_matrix: sp.spmatrix, shards: Sequence[ClientShard]) -> np.ndarray:
    """Positive-label counts per client, shape ``(K, L)``."""
    y = sp.csr_matrix(label_matrix)
    y = (y != 0).astype(np.int64)
    return np.vstack([np.asarray(y[s.indices].sum(axis=0)).ravel() for s in shards]) if shards else np.zeros((0, y.shape[1]))


def normalised(counts: np.ndarray) -> np.ndarray:
    """Each row divided by its sum (the paper's L_dist); a row with no label stays all zero."""
    totals = counts.sum(axis=1, keepdims=True).astype(np.float64)
    return np.divide(counts, totals, out=np.zeros(counts.shape, dtype=np.float64), where=totals > 0)


def kl_matrix(distributions: np.ndarray, *, epsilon: float = EPSILON) -> np.ndarray:
    """``KL(p_i || p_j)`` for every pair of rows, after smoothing each row as ``(p + eps) / (1 + L eps)``."""
    p = (distributions + epsilon) / (1.0 + distributions.shape[1] * epsilon)
    logp = np.log(p)
    kl = np.sum(p * logp, axis=1)[:, None] - p @ logp.T  # sum_l p_i ln p_i - sum_l p_i ln p_j
    np.fill_diagonal(kl, 0.0)
    return np.maximum(kl, 0.0)  # rounding can leave -1e-17 where two rows are equal


def heterogeneity_report(
    label_matrix_csr: sp.spmatrix,
    shards: Sequence[ClientShard],
    *,
    label_names: Sequence[str] | None = None,
    epsilon: float = EPSILON,
) -> dict:
    """Sizes, label distributions and the KL matrix of ``shards`` over the rows of ``label_matrix_csr``.

    Returns a JSON-serialisable dict (plain lists, ints and floats).
    """
    counts = label_counts(label_matrix_csr, shards)
    dist = normalised(counts)
    kl = kl_matrix(dist, epsilon=epsilon)
    k = len(shards)
    sizes = [int(len(s.indices)) for s in shards]
    pairs = k * (k - 1)
    total = float(kl.sum())
    per_client = (kl.sum(axis=1) / (k - 1)).tolist() if k > 1 else [0.0] * k
    return {
        "num_clients": k,
        "num_labels": int(counts.shape[1]),
        "client_ids": [int(s.client_id) for s in shards],
        "label_names": list(label_names) if label_names is not None else None,
        "sizes": sizes,
        "size_stats": {
            "min": int(min(sizes)) if sizes else 0,
            "median": float(np.median(sizes)) if sizes else 0.0,
            "max": int(max(sizes)) if sizes else 0,
            "mean": float(np.mean(sizes)) if sizes else 0.0,
        },
        "label_counts": counts.astype(int).tolist(),
        "label_distribution": dist.tolist(),
        "clients_without_labels": [int(s.client_id) for s, c in zip(shards, counts, strict=True) if c.sum() == 0],
        "epsilon": epsilon,
        "kl": kl.tolist(),
        "kl_total": total,
        "kl_mean": total / pairs if pairs else 0.0,
        "kl_mean_to_others": per_client,
        "kl_definition": KL_DEFINITION,
    }


def write_report(report: dict, out_dir: str | Path, *, title: str | None = None) -> tuple[Path, Path]:
    """Write ``heterogeneity.json`` and ``heterogeneity.png`` into ``out_dir`` (created); return both paths."""
    import json

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "heterogeneity.json", out / "heterogeneity.png"
    json_path.write_text(json.dumps(report, indent=1) + "\n")
    plot_report(report, png_path, title=title)
    return json_path, png_path


def plot_report(report: dict, path: str | Path, *, title: str | None = None) -> Path:
    """A two-panel PNG like the paper's Fig. 3: (a) clients × labels distribution, (b) the KL matrix."""
    from matplotlib.figure import Figure  # the object API: no pyplot, no global backend (renders with Agg)

    dist = np.asarray(report["label_distribution"], dtype=float).reshape(report["num_clients"], report["num_labels"])
    kl = np.asarray(report["kl"], dtype=float).reshape(report["num_clients"], report["num_clients"])
    k, n_labels = dist.shape
    names = [f"c{c}" for c in report["client_ids"]]
    w_dist = min(3.5 + 0.06 * n_labels, 9.0)
    fig = Figure(figsize=(w_dist + 5.5, max(4.5, 1.5 + 0.3 * min(k, 40))), layout="constrained")
    ax_d, ax_k = fig.subplots(1, 2, width_ratios=[w_dist, 5.5])

    im = ax_d.imshow(dist, aspect="auto", cmap="viridis", interpolation="nearest")
    ax_d.set(title="(a) label distribution per client", xlabel="label", ylabel="client")
    fig.colorbar(im, ax=ax_d, shrink=0.8, label="share of the client's positive labels")
    im = ax_k.imshow(kl, cmap="magma_r", interpolation="nearest")
    ax_k.set(title=f"(b) KL(p_i || p_j), total {report['kl_total']:.3g}", xlabel="client j", ylabel="client i")
    fig.colorbar(im, ax=ax_k, shrink=0.8, label="nats")
    if k <= 40:
        for ax in (ax_d, ax_k):
            ax.set_yticks(range(k), names, fontsize=7)
        ax_k.set_xticks(range(k), names, fontsize=7, rotation=90)
    names_l = report.get("label_names")
    if names_l and n_labels <= 30:
        ax_d.set_xticks(range(n_labels), names_l, fontsize=7, rotation=90)
    if k <= 12:
        top = kl.max() or 1.0
        for i in range(k):
            for j in range(k):
                ax_k.text(j, i, f"{kl[i, j]:.2g}", ha="center", va="center", fontsize=6,
                          color="white" if kl[i, j] > 0.6 * top else "black")  # fmt: skip
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=120)
    return Path(path)
