"""Evaluation of the server's model, and epoch selection for centralised baselines (mixed into
:class:`~secure_fed.engine.Experiment`; the :class:`~secure_fed.engine.callbacks.Evaluation` callback calls it).

Test metrics come from the model family's scores on the test split. A centralised baseline (the oracle)
also scores a validation split carved from its training data and reports the evaluated epoch with the best
validation score, never one selected on the test split.
"""

from __future__ import annotations

from typing import Any

import torch

from secure_fed.metrics import evaluate_scores


class EvaluationMixin:
    @torch.no_grad()
    def evaluate(self, split: str = "test") -> dict[str, float]:
        """Metrics of the current θ, W on the test split, or on a centralised baseline's validation split."""
        x, y = (self.fed.x_test, self.fed.y_test) if split == "test" else (self.fed.x_val, self.fed.y_val)
        for n, p in self.encoder.named_parameters():
            p.copy_(self.theta[n])
        self.encoder.eval()
        chunks = [self.family.scores(self.encoder, self.W, xb) for xb in torch.split(x, 2048)]
        scores = torch.cat(chunks).float().cpu().numpy()
        ks = tuple(self.cfg.evaluation.ks)
        return evaluate_scores(scores, y, ks=ks, threshold=self.cfg.evaluation.threshold)

    def evaluation_record(self) -> dict[str, Any]:
        """A metrics line's evaluation: test metrics of the current model, and W's mean row cosine."""
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
