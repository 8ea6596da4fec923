"""Evaluation of the server's model, and epoch selection for centralised baselines: functions of the
:class:`~secure_fed.engine.model_state.ModelState` and the federation's test split, and the two callbacks that
add their metrics to a round's record (:class:`Evaluation`, :class:`ClientEvaluation`).

Test metrics come from the model family's scores on the test split. A centralised baseline (the oracle)
also scores a validation split carved from its training data and reports the evaluated epoch with the best
validation score, never one selected on the test split.

In the general multi-label setting each client also has its own test rows (``Federation.client_test``); the FLAG
paper's metrics (§5.1, Table 1) are then

* ``GmAP``: the server's model on each client's test rows, mAP averaged over clients (``GmAP_std``: the std
  over clients, ``GmAP_worst``: the worst client) — a metric of the released model, public like the others;
* ``AmAP``: each client's own model after its local training in the round, on its own test rows, averaged
  (``AmAP_std``; ``WmAP``: the worst client's) — computed client side by :class:`ClientEvaluation`.

A client's mAP is the macro AP over the labels with both a positive and a negative in its test rows (a label all
its rows have gets AP = 1 from any model); clients with no such label are left out of the averages.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from secure_fed.algorithms.base import ClientFn
from secure_fed.engine.callbacks import Callback
from secure_fed.engine.model_state import ModelState
from secure_fed.engine.run_context import RunContext
from secure_fed.engine.tensor_tree import to_cpu, to_device
from secure_fed.errors import PrivacyViolation
from secure_fed.metrics import blocks as label_blocks
from secure_fed.metrics import center_rows, evaluate_scores, macro_average_precision
from secure_fed.models.shared_direction import remove_shared_direction
from secure_fed.models.sparse_rows import SparseRows, split_rows
from secure_fed.plan import EvaluationPlan, RunPlan
from secure_fed.release import NO_MECHANISM, Released, protected, public
from secure_fed.run_files import METRICS_FILE
from secure_fed.run_status import TRAINED


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


@torch.no_grad()
def model_scores(
    model: ModelState, theta: dict[str, torch.Tensor], x: torch.Tensor, rows: torch.Tensor | None = None
) -> np.ndarray:
    """(n, C) scores of the model θ on ``x``, with ``rows`` (default: the server's W, when the family has rows)."""
    model.load_theta(theta)
    rows = model.W if rows is None else rows
    width = SPARSE_ROW_WIDTH if isinstance(x, SparseRows) else x.shape[1]
    chunks = [model.family.scores(model.encoder, rows, xb) for xb in split_rows(x, eval_chunk_rows(width))]
    return torch.cat(chunks).float().cpu().numpy()


def scoring_rows(model: ModelState, ev: EvaluationPlan) -> torch.Tensor | None:
    """The class rows every metric scores with: the server's W, without its shared direction when
    ``evaluation.remove_shared_direction`` (:func:`~secure_fed.models.shared_direction.remove_shared_direction`)."""
    if model.W is None or not ev.remove_shared_direction:
        return model.W
    return remove_shared_direction(model.W)


def evaluation_scores(
    model: ModelState, theta: dict[str, torch.Tensor], x, ev: EvaluationPlan, *, centred: bool = True
) -> np.ndarray:
    """The (n, C) scores the ranking metrics read: :func:`model_scores` with :func:`scoring_rows`, each row
    centred when ``evaluation.center_scores`` (:func:`~secure_fed.metrics.center_rows`); with ``centred=False`` the
    scores the threshold metrics read (never centred)."""
    scores = model_scores(model, theta, x, scoring_rows(model, ev))
    return center_rows(scores) if ev.center_scores and centred else scores


@torch.no_grad()
def blocked_metrics(model: ModelState, x, y: sp.csr_matrix, ev) -> dict[str, float]:
    """The metrics from blocks of W's rows (:mod:`secure_fed.metrics.blocks`): the test rows' embeddings
    g_θ(x) once, then each block's scores against them; never the (n, C) score matrix. With
    ``evaluation.center_scores`` a first pass over the blocks sums each row's scores for its mean (the ranking metrics'
    shift)."""
    model.load_theta(model.theta)
    width = SPARSE_ROW_WIDTH if isinstance(x, SparseRows) else x.shape[1]
    outs = [model.family.forward(model.encoder, xb) for xb in split_rows(x, eval_chunk_rows(width))]
    W = scoring_rows(model, ev)

    def block_scores(sl: slice) -> np.ndarray:
        return torch.cat([model.family.score(o, W[sl]) for o in outs]).float().cpu().numpy()

    shift = None
    if ev.center_scores:
        C = W.shape[0]
        step = label_blocks.label_block_size(y.shape[0], C)
        total = sum(block_scores(slice(a, min(C, a + step))).astype(np.float64).sum(axis=1) for a in range(0, C, step))
        shift = total / C
    return label_blocks.evaluate_label_blocks(block_scores, y, ks=tuple(ev.ks), threshold=ev.threshold, row_shift=shift)


def evaluate(model: ModelState, fed, ev: EvaluationPlan, split: str = "test") -> dict[str, float]:
    """Metrics of the current θ, W on the test split (with GmAP when clients have test rows), or on a
    centralised baseline's validation split.

    When the full score matrix would hold more than :data:`~secure_fed.metrics.blocks.BLOCK_ELEMENTS` entries
    and the family has a row table, the metrics come from blocks of labels (the same values, tested; an
    extreme-classification test split never forms the (n, C) matrix); otherwise from the whole matrix."""
    x, y = (fed.x_test, fed.y_test) if split == "test" else (fed.x_val, fed.y_val)
    ks = tuple(ev.ks)
    general = split == "test" and fed.client_test is not None
    n, C = y.shape
    if model.W is not None and not general and n * C > label_blocks.BLOCK_ELEMENTS:
        return blocked_metrics(model, x, y, ev)
    raw = model_scores(model, model.theta, x, scoring_rows(model, ev))
    scores = center_rows(raw) if ev.center_scores else raw
    y = y.toarray() if sp.issparse(y) else y
    out = evaluate_scores(scores, y, ks=ks, threshold=ev.threshold, threshold_scores=raw)  # thresholds: the model's own
    if general:
        out.update(spread(client_maps(scores, y, fed.client_test), "GmAP", worst="GmAP_worst"))
    return out


def is_evaluation_round(plan: RunPlan, completed: int) -> bool:
    """Whether the metrics are computed once ``completed`` rounds are done (every N, and after the last)."""
    return completed % plan.evaluation.every == 0 or completed == plan.training.rounds


#: why a test metric of the released model may be released (:func:`secure_fed.release.public`)
TEST_METRIC_WHY = "a metric of the released model on the public test split: a post-processing of DP outputs and public data"
#: why W's mean row cosine may be released
W_COSINE_WHY = "W's mean row cosine: a function of the released W"


#: the metrics :class:`ClientEvaluation` adds: of the clients' own local models, which no DP mechanism covers
CLIENT_MODEL_METRICS = ("AmAP", "AmAP_std", "WmAP")


def tagged_metric(name: str, value: Any, *, on_validation: bool = False) -> Released:
    """A released metric with its tag: the clients' own models' (:data:`CLIENT_MODEL_METRICS`) and every metric on a
    validation split of the training data (``dataset.evaluate_on: validation``) with no mechanism on them, every other
    one the released model's on the public test split."""
    if on_validation or name in CLIENT_MODEL_METRICS:
        return protected(value, NO_MECHANISM)
    return public(value, TEST_METRIC_WHY)


def evaluation_record(ctx: RunContext) -> dict[str, Any]:
    """A metrics line's evaluation, tagged for release (:mod:`secure_fed.release`): test metrics of the current
    model, and W's mean row cosine (none for an algorithm without a global model, e.g. ``local``)."""
    if not ctx.algorithm.has_global_model:
        return {}
    on_validation = ctx.plan.dataset.evaluate_on == "validation"  # held-out training rows: no mechanism covers them
    metrics = evaluate(ctx.model, ctx.fed, ctx.plan.evaluation)
    rec: dict[str, Any] = {k: tagged_metric(k, v, on_validation=on_validation) for k, v in metrics.items()}
    if ctx.model.W is not None:
        rec["W_mean_cos"] = public(ctx.model.mean_row_cosine(), W_COSINE_WHY)
    return rec


def evaluated(record: dict[str, Any]) -> bool:
    """Whether a metrics line is an evaluated round (``mAP`` is computed at every evaluation, whatever the ks;
    ``AmAP`` alone for an algorithm without a global model)."""
    return "mAP" in record or "AmAP" in record


def selection_metric(ev: EvaluationPlan) -> str:
    """The validation metric a centralised baseline selects its epoch by."""
    return f"P@{min(ev.ks)}"


class Evaluation(Callback):
    """Test metrics every ``evaluation.every`` rounds and after the last; a centralised baseline also scores its
    validation split to select the epoch it reports. A run stopped by its privacy budget evaluates the model as
    released at the stop.

    Its state: the best validation epoch so far (``best``, saved in the server's checkpoint); at the release, θ and
    W go back to it and ``ctx.records.selected`` names it, with its test metrics."""

    name = "evaluation"

    def __init__(self):
        self.best: dict[str, Any] | None = None  #: centralised baselines: the best epoch on validation so far

    def on_record(self, ctx, record, diagnostics) -> None:
        if is_evaluation_round(ctx.plan, ctx.round):
            record.update(evaluation_record(ctx))
            self.select_on_validation(ctx, diagnostics)

    def select_on_validation(self, ctx: RunContext, diagnostics: dict[str, Any]) -> None:
        """Centralised baselines: keep the evaluated epoch with the best validation score (training data only)."""
        if ctx.fed.x_val is None:
            return
        key = selection_metric(ctx.plan.evaluation)
        score = evaluate(ctx.model, ctx.fed, ctx.plan.evaluation, "val")[key]
        diagnostics[f"validation_{key}"] = score  # a statistic of training data: private
        if self.best is None or score > self.best["score"]:
            m = ctx.model
            self.best = {"round": ctx.round, "score": score, "theta": {n: t.clone() for n, t in m.theta.items()},
                         "W": None if m.W is None else m.W.clone()}  # fmt: skip

    def on_run_end(self, ctx, status) -> None:
        rec = ctx.records
        if status == "budget_exhausted" and rec.history and not evaluated(rec.history[-1]):
            rec.release(evaluation_record(ctx), METRICS_FILE, into=rec.history[-1])

    def on_release(self, ctx, status) -> None:
        """Report the selected epoch: θ, W back to the best validation snapshot, then its test metrics."""
        if status not in TRAINED or self.best is None:
            return
        m = ctx.model
        m.theta = {n: t.clone() for n, t in self.best["theta"].items()}
        m.W = None if self.best["W"] is None else self.best["W"].clone()
        ctx.records.selected = {"round": self.best["round"], "metrics": evaluate(m, ctx.fed, ctx.plan.evaluation),
                                "W_mean_cos": m.mean_row_cosine()}  # fmt: skip

    def checkpoint_state(self, ctx) -> dict[str, Any]:
        return {"best": to_cpu(self.best)}

    def load_checkpoint_state(self, ctx, state) -> None:
        best = state.get("best")
        self.best = None if best is None else to_device(best, ctx.device)


class ClientEvaluation(Callback):
    """AmAP and WmAP (the FLAG paper §5.1): in an evaluation round, each client scores its own model after its
    local training (:meth:`Algorithm.client_model`) on its own test rows, client side, and the round's record gets
    the mean, the std over clients and the worst client's mAP.

    These are metrics of models no DP mechanism protects (the clients' local models), so in a run with DP they go
    to the private diagnostics, not to ``metrics.jsonl``; without DP (ε = ∞) they are released beside the others.
    Active only in the general setting (clients hold test rows) with a model family without a row table.

    On Flower each node's copy computes its clients' mAPs and reports them to the server beside the reply, only
    in a run without protocol layers, where the server sees each client's plaintext update anyway (under DP a
    client's mAP is a statistic of its data that no mechanism protects, and under a secure sum the server must not
    learn per-client values: it stays on the node and these metrics are not measured); the server refuses a report
    in a run with layers."""

    name = "client_evaluation"

    def __init__(self):
        self.ctx: RunContext | None = None  #: the run's context when active (the client side scores with its model)
        self.maps: dict[int, float] = {}

    def on_init(self, ctx) -> None:
        active = ctx.fed.client_test is not None and not ctx.algorithm.centralized and ctx.model.W is None
        self.ctx = ctx if active else None

    def acts_on_clients(self) -> bool:
        return self.ctx is not None

    def client_mod(self, fn: ClientFn) -> ClientFn:
        ctx = self.ctx
        if ctx is None:
            return fn

        def evaluated(payload, data):
            reply = fn(payload, data)
            if is_evaluation_round(ctx.plan, ctx.round + 1) and data.eval_x is not None and len(data.eval_x):
                theta = ctx.algorithm.client_model(payload, data, reply)
                scores = evaluation_scores(ctx.model, theta, data.eval_x, ctx.plan.evaluation)
                found = client_maps(scores, data.eval_y, [np.arange(len(data.eval_y))])
                if found:
                    self.maps[data.client_id] = found[0]
            return reply

        return evaluated

    def reports_from_remote_clients(self) -> bool:
        return True

    def client_report(self, ctx, cid: int) -> dict[str, float]:
        found = self.maps.pop(cid, None)
        if found is None or ctx.stack:  # under a protocol layer the client's mAP stays on its node
            return {}
        return {"mAP": float(found)}

    def on_client_report(self, ctx, cid: int, report: dict[str, float]) -> None:
        if self.ctx is None or ctx.stack or set(report) != {"mAP"}:
            raise PrivacyViolation(f"client {cid}'s client-evaluation report {sorted(report)} is not allowed in this run")
        self.maps[cid] = float(report["mAP"])

    def on_record(self, ctx, record, diagnostics) -> None:
        if self.ctx is None or not self.maps:
            return
        stats = spread([self.maps[c] for c in sorted(self.maps)], CLIENT_MODEL_METRICS[0], worst=CLIENT_MODEL_METRICS[2])
        self.maps = {}
        if ctx.stack.accounting():
            diagnostics.update(stats)
        else:  # no DP: ε is ∞ already, and the release says these values have no mechanism on them
            record.update({k: tagged_metric(k, v) for k, v in stats.items()})
