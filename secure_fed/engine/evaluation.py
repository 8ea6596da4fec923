"""Evaluation of the server's model, and epoch selection for centralised baselines (mixed into
:class:`~secure_fed.engine.Experiment`; the :class:`~secure_fed.engine.callbacks.Evaluation` callback calls it).

Test metrics come from the model family's scores on the test split. A centralised baseline (the oracle)
also scores a validation split carved from its training data and reports the evaluated epoch with the best
validation score, never one selected on the test split.

In the general multi-label setting each client also has its own test rows (``Federation.client_test``); the FLAG
paper's metrics (§5.1, Table 1) are then

* ``GmAP``: the server's model on each client's test rows, mAP averaged over clients (``GmAP_std``: the std
  over clients, ``GmAP_worst``: the worst client) — a metric of the released model, public like the others;
* ``AmAP``: each client's own model after its local training in the round, on its own test rows, averaged
  (``AmAP_std``; ``WmAP``: the worst client's) — computed client side by
  :class:`~secure_fed.engine.callbacks.ClientEvaluation`.

A client's mAP is the macro AP over the labels with both a positive and a negative in its test rows (a label all
its rows have gets AP = 1 from any model); clients with no such label are left out of the averages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from secure_fed.metrics import blocks as label_blocks
from secure_fed.metrics import evaluate_scores, macro_average_precision
from secure_fed.models.sparse_rows import SparseRows, split_rows


def client_map(scores: np.ndarray, y: np.ndarray) -> float:
    """One client's mAP (percent): the macro AP over the labels that have both a positive and a negative among
    its rows. A label every row has scores AP = 1 whatever the model (and k-modes clients often share one label
    throughout), so it says nothing and is left out; NaN when no label qualifies."""
    y = np.asarray(y)
    informative = y.any(axis=0) & ~y.all(axis=0)
    if not informative.any():
        return float("nan")
    return 100 * macro_average_precision(scores[:, informative], y[:, informative])


def client_maps(scores: np.ndarray, y: np.ndarray, rows: list[np.ndarray]) -> list[float]:
    """Each client's :func:`client_map` of ``scores`` on its rows; clients with no informative label are left
    out (their mAP is undefined)."""
    out = [client_map(scores[r], y[r]) for r in rows if len(r)]
    return [m for m in out if not np.isnan(m)]


def spread(values: list[float], prefix: str, *, worst: str) -> dict[str, float]:
    """Mean, std over clients (population std) and the worst client of per-client mAPs, under ``prefix``."""
    if not values:
        return {}
    v = np.asarray(values, dtype=float)
    return {prefix: float(v.mean()), f"{prefix}_std": float(v.std()), worst: float(v.min())}


#: input elements scored in one forward pass: 2048 rows of every Mulan set, ~111 images of 224×224 (a ResNet's
#: first stage holds ~5× its input, so a chunk's activations stay near 350 MB)
EVAL_CHUNK_ELEMENTS = 2**24


#: the width a chunk of sparse rows counts as: their first layer's output, not their D features
SPARSE_ROW_WIDTH = 8192


def eval_chunk_rows(width: int) -> int:
    """Rows per evaluation forward pass for inputs ``width`` wide (at most 2048)."""
    return max(1, min(2048, EVAL_CHUNK_ELEMENTS // max(1, width)))


class EvaluationMixin:
    @torch.no_grad()
    def model_scores(self, theta: dict[str, torch.Tensor], x: torch.Tensor) -> np.ndarray:
        """(n, C) scores of the model θ (with the server's W when the family has rows) on ``x``."""
        self._load_theta(theta)
        width = SPARSE_ROW_WIDTH if isinstance(x, SparseRows) else x.shape[1]
        chunks = [self.family.scores(self.encoder, self.W, xb) for xb in split_rows(x, eval_chunk_rows(width))]
        return torch.cat(chunks).float().cpu().numpy()

    def _load_theta(self, theta: dict[str, torch.Tensor]) -> None:
        for n, p in self.encoder.named_parameters():
            p.copy_(theta[n])
        self.encoder.eval()

    @torch.no_grad()
    def _blocked_metrics(self, x, y: sp.csr_matrix) -> dict[str, float]:
        """The metrics from blocks of W's rows (:mod:`secure_fed.metrics.blocks`): the test rows' embeddings
        g_θ(x) once, then each block's scores against them; never the (n, C) score matrix."""
        self._load_theta(self.theta)
        width = SPARSE_ROW_WIDTH if isinstance(x, SparseRows) else x.shape[1]
        outs = [self.family.forward(self.encoder, xb) for xb in split_rows(x, eval_chunk_rows(width))]
        W = self.W

        def block_scores(sl: slice) -> np.ndarray:
            return torch.cat([self.family.score(o, W[sl]) for o in outs]).float().cpu().numpy()

        ev = self.cfg.evaluation
        return label_blocks.evaluate_label_blocks(block_scores, y, ks=tuple(ev.ks), threshold=ev.threshold)

    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Metrics of the current θ, W on the test split (with GmAP when clients have test rows), or on a
        centralised baseline's validation split.

        When the full score matrix would hold more than :data:`~secure_fed.metrics.blocks.BLOCK_ELEMENTS` entries
        and the family has a row table, the metrics come from blocks of labels (the same values, tested; an
        extreme-classification test split never forms the (n, C) matrix); otherwise from the whole matrix."""
        x, y = (self.fed.x_test, self.fed.y_test) if split == "test" else (self.fed.x_val, self.fed.y_val)
        ks = tuple(self.cfg.evaluation.ks)
        general = split == "test" and self.fed.client_test is not None
        n, C = y.shape
        if self.W is not None and not general and n * C > label_blocks.BLOCK_ELEMENTS:
            return self._blocked_metrics(x, y)
        scores = self.model_scores(self.theta, x)
        y = y.toarray() if sp.issparse(y) else y
        out = evaluate_scores(scores, y, ks=ks, threshold=self.cfg.evaluation.threshold)
        if general:
            out.update(spread(client_maps(scores, y, self.fed.client_test), "GmAP", worst="GmAP_worst"))
        return out

    def is_evaluation_round(self, completed: int) -> bool:
        """Whether the metrics are computed once ``completed`` rounds are done (every N, and after the last)."""
        return completed % self.cfg.evaluation.every == 0 or completed == self.cfg.training.rounds

    def evaluation_record(self) -> dict[str, Any]:
        """A metrics line's evaluation: test metrics of the current model, and W's mean row cosine (none for an
        algorithm without a global model, e.g. ``local``)."""
        if not self.algorithm.has_global_model:
            return {}
        rec: dict[str, Any] = dict(self.evaluate())
        if self.W is not None:
            rec["W_mean_cos"] = self.mean_row_cosine()
        return rec

    def _selection_metric(self) -> str:
        return f"P@{min(self.cfg.evaluation.ks)}"

    def select_on_validation(self, diagnostics: dict[str, Any]) -> None:
        """Centralised baselines: keep the evaluated epoch with the best validation score (training data only)."""
        if self.fed.x_val is None:
            return
        key = self._selection_metric()
        score = self.evaluate("val")[key]
        diagnostics[f"validation_{key}"] = score  # a statistic of training data: private
        if self.best is None or score > self.best["score"]:
            self.best = {"round": self.round, "score": score, "theta": {n: t.clone() for n, t in self.theta.items()},
                         "W": None if self.W is None else self.W.clone()}  # fmt: skip

    def _restore_selected(self) -> None:
        """Report the selected epoch: θ, W back to the best validation snapshot, then its test metrics."""
        if self.best is None:
            return
        self.theta = {n: t.clone() for n, t in self.best["theta"].items()}
        self.W = None if self.best["W"] is None else self.best["W"].clone()
        self.selected = {"round": self.best["round"], "metrics": self.evaluate(), "W_mean_cos": self.mean_row_cosine()}
