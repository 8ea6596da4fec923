"""FedALC and FedALC-fixed (Federated Averaging by exploring Label Correlations).

Both start with label-set collection (``label_sets.py``): the server learns,
from tokens and labels only, which labels co-occur on an instance.

* **FedALC** (Algorithm 1): each round, after averaging, the server steps on the
  top-K correlation regulariser (eq. 11) with weights γ (eqs. 9–10)::

      W ← W − λ·η·∇ Σ_u Σ_{u'∈N_K(u)} s·γ_uu' · max(0, ν − d(w_u, w_u'))²

  **Scale of γ.** Eq. 10 normalises each row of γ to sum to 1 over all C − 1
  other labels, which makes the regulariser ~C× weaker than FedAwS's at the
  same λ. ``gamma_scale`` (default ``"classes_minus_one"``, i.e. s = C − 1)
  restores a mean weight of 1 per pair so λ means comparable things for both
  methods; set it to 1.0 for the literal eq. 10.

* **FedALC-fixed** (Algorithm 2): before training, the server runs
  ``fixed_steps`` steps of W ← W − λ·η·∇ reg_fc(W) (eq. 12: co-occurring labels
  pulled together with weight α, others pushed beyond margin ν with weight β).
  W then stays fixed and clients train θ only. The β term sums over every pair
  of labels (C²·d work by definition), in blocks of rows; the co-occurring pairs
  sparsely: no C × C matrix (``fixed_embedding_loss_grad``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import scipy.sparse as sp
import torch
from torch.nn import functional as F

from secure_fed.algorithms.base import Algorithm, SetupContext
from secure_fed.algorithms.client import token_client
from secure_fed.algorithms.fedaws import regularizer_step
from secure_fed.algorithms.label_sets import merge_label_sets
from secure_fed.algorithms.params.fedalc import FedALCFixedParams, FedALCParams
from secure_fed.algorithms.regularizers import (
    PAIR_BLOCK_ELEMENTS,
    CorrelationWeights,
    approximate_nearest_classes,
    correlation_top_k,
    correlation_top_k_grad,
    fixed_embedding_loss_grad,
    hinge_grad_row_sums,
    label_set_correlation_grads,
    label_set_fixed_grads_sparse,
    nearest_classes,
    neighbour_hinge_grads,
    neighbour_recall,
    outer_blocks,
    sparse_cooccurrence,
)
from secure_fed.messages import ByteList, OwnLabel, Setting

#: ``W → stats`` (or None: stop): the server's step on W over the label sets. The algorithm's default is the
#: non-private step; a protocol layer wraps it by replacing ``algorithm.w_step`` with its own step built
#: from the algorithm's public ``per_set_gradients``, ``step_size`` and ``regularizer_value``.
WStep = Callable[[torch.Tensor], "dict[str, float] | None"]


#: classes on which the approximate neighbour search's recall is measured each step (exact search on these rows only)
RECALL_ROWS = 256


class _LabelSetMixin:
    """Runs label-set collection and keeps the merged label sets."""

    #: label-set collection: the server asks for a tokenizer's tokens; a client answers with tokens and its label
    downlink_rules = {**Algorithm.downlink_rules, "tokenizer": Setting()}
    uplink_rules = {**Algorithm.uplink_rules, "tokens": ByteList(), "label": OwnLabel()}

    #: the merged label sets, (n_all, C) sparse CSR (one row per distinct instance token)
    label_sets: sp.csr_matrix | None = None

    def collect_label_sets(self, ctx: SetupContext) -> dict[str, Any]:
        replies = ctx.query(lambda cid: {"tokenizer": self.cfg.tokenizer}, token_client)
        msgs = [(r["tokens"], r["label"]) for _, r in replies]
        self.label_sets = merge_label_sets(msgs, ctx.num_labels)
        sent = sum(len(t) for t, _ in msgs)
        return {
            "label_sets": int(self.label_sets.shape[0]),
            "tokens_received": sent,
            "mean_labels_per_set": float(self.label_sets.sum(axis=1).mean()) if self.label_sets.shape[0] else 0.0,
        }


class FedALC(_LabelSetMixin, Algorithm):
    params = FedALCParams

    def __init__(self, cfg, *, device=None, loss=None):
        super().__init__(cfg, device=device, loss=loss)
        self.w_step: WStep = self.correlation_update

    def setup(self, ctx: SetupContext) -> dict[str, Any]:
        facts = self.collect_label_sets(ctx)
        self._build_weights(ctx.num_labels)
        return facts

    @property
    def step_size(self) -> float:
        return self.cfg.lam * self.cfg.reg_lr

    def _scale(self, num_labels: int) -> float:
        return (num_labels - 1) if self.cfg.gamma_scale == "classes_minus_one" else float(self.cfg.gamma_scale)

    def per_set_gradients(self, V: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """Eq. 11 with σ weights (eq. 9) as a sum over label sets: per-set gradients (B, C, d) for label sets (B, C).
        The W-only parts (neighbours, pair gradients) are computed once here, for every chunk of sets."""
        cfg = self.cfg
        nn_idx, _ = self.neighbours(V, recall=False)  # the DP step reports no diagnostic of it: not measured
        # the (C, K, d) pair gradients once for every chunk, unless they are XC-sized: then each chunk computes
        # those of its own labels' pairs (the same values)
        small = nn_idx.numel() * V.shape[1] <= PAIR_BLOCK_ELEMENTS
        pair = neighbour_hinge_grads(V, nn_idx, cfg.margin) if small else None
        scale = self._scale(V.shape[0])
        return lambda Y: label_set_correlation_grads(V, Y, k=cfg.k, margin=cfg.margin, scale=scale, nn_idx=nn_idx,
                                                     pair_grads=pair)  # fmt: skip

    def _build_weights(self, num_labels: int) -> None:
        """γ (eq. 10) or σ (eq. 9), scaled, from the sparse co-occurrence counts: looked up at each step's C·K
        neighbour pairs, never a C × C matrix."""
        self.weights = CorrelationWeights(self.label_sets, normalize=self.cfg.normalize_gamma, scale=self._scale(num_labels))

    def server_step(self, W: torch.Tensor, round_idx: int, participating: torch.Tensor) -> dict[str, float]:
        return self.w_step(W) or {}

    def neighbours(self, W: torch.Tensor, *, recall: bool = True) -> tuple[torch.Tensor, dict[str, float]]:
        """N_K(u) of every class (``algorithm.neighbour_search``) and, for the approximate search with ``recall``, its
        recall against the exact search on :data:`RECALL_ROWS` evenly spaced classes (a diagnostic)."""
        cfg = self.cfg
        if cfg.neighbour_search == "exact":
            return nearest_classes(W, cfg.k), {}
        nn_idx = approximate_nearest_classes(
            W, cfg.k, index=cfg.ann_index, nprobe=cfg.ann_nprobe, ef_search=cfg.ann_ef_search, hnsw_m=cfg.ann_hnsw_m,
            ef_construction=cfg.ann_ef_construction,
        )  # fmt: skip
        if not recall:
            return nn_idx, {}
        rows = torch.linspace(0, W.shape[0] - 1, min(RECALL_ROWS, W.shape[0]), device=W.device).long().unique()
        return nn_idx, {"neighbour_recall": neighbour_recall(W, nn_idx, nn_idx.shape[1], rows)}

    def correlation_update(self, W: torch.Tensor) -> dict[str, float]:
        """One step on eq. 11 with the γ weights (the default ``w_step``; the ``dp`` layer wraps it)."""
        cfg = self.cfg
        nn_idx, stats = self.neighbours(W)
        blocks = outer_blocks(torch.arange(W.shape[0], device=W.device), cfg.k, W.shape[1])
        if len(blocks) == 1:  # one expression (Bibtex-sized C)
            fn = lambda V: correlation_top_k(V, self.weights, cfg.k, cfg.margin, nn_idx=nn_idx)  # noqa: E731
            return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr), **stats}
        # XC-sized C: the gradient by hand, block by block, into one table; then every row steps (each is an outer
        # class of some block) and is renormalised, as regularizer_step does
        with torch.no_grad():
            grad, norms = torch.zeros_like(W), W.norm(dim=-1).clamp(min=1e-12)
            reg = sum(
                correlation_top_k_grad(W, self.weights, cfg.margin, rows=rows, nn_idx=nn_idx[rows], out=grad, norms=norms)
                for rows in blocks
            )
            W.copy_(F.normalize(W.sub_(cfg.lam * cfg.reg_lr * grad), dim=-1))
        return {"reg": reg, **stats}

    def state_dict(self) -> dict[str, Any]:
        return {"label_sets": self.label_sets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.label_sets = state["label_sets"]
        self._build_weights(self.label_sets.shape[1])


class FedALCFixed(_LabelSetMixin, Algorithm):
    params = FedALCFixedParams

    def __init__(self, cfg, *, device=None, loss=None):
        super().__init__(cfg, device=device, loss=loss)
        self.w_step: WStep = self.pretrain_update

    @property
    def step_size(self) -> float:
        return self.cfg.lam * self.cfg.fixed_lr

    #: eq. 12's sparse co-occurrence counts (A, n_u, n_all), from the label sets
    _counts: tuple | None = None

    def _loss_grad(self, W: torch.Tensor) -> tuple[float, torch.Tensor]:
        """reg_fc(W) (eq. 12) and its gradient, over every pair in blocks and the co-occurring pairs sparsely."""
        if self._counts is None:
            self._counts = sparse_cooccurrence(self.label_sets)
        A, n_u, n_all = self._counts
        cfg = self.cfg
        return fixed_embedding_loss_grad(W, A, n_u, n_all, alpha=cfg.alpha, beta=cfg.beta, margin=cfg.margin)

    def regularizer_value(self, W: torch.Tensor) -> float:
        """reg_fc(W) (eq. 12) over the collected label sets."""
        return self._loss_grad(W)[0]

    def per_set_gradients(self, V: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """Eq. 12 as a sum over label sets: per-set gradients (B, C, d) for label sets (B, C), from the hinge row
        sums over all labels (once per step) and each set's own labels' pairs: no (C, C, d) tensor."""
        cfg = self.cfg
        S = hinge_grad_row_sums(V, cfg.margin)
        return lambda Y: label_set_fixed_grads_sparse(V, Y, alpha=cfg.alpha, beta=cfg.beta, margin=cfg.margin, row_sums=S)

    def setup(self, ctx: SetupContext) -> dict[str, Any]:
        facts = self.collect_label_sets(ctx)
        cfg = self.cfg
        self._counts = None
        first, done = None, 0
        for _ in range(cfg.fixed_steps):
            out = self.w_step(ctx.W)
            if out is None:  # a wrapping layer stopped the pre-training (the dp layer's budget is spent)
                break
            first = out["reg"] if first is None else first
            done += 1
        facts.update({"reg_fc_first": first, "reg_fc_last": self.regularizer_value(ctx.W), "fixed_steps_done": done})
        return facts

    def pretrain_update(self, W: torch.Tensor) -> dict[str, float] | None:
        """One step of W ← normalize(W − λη∇reg_fc(W)) (eq. 12): the default ``w_step`` (the ``dp`` layer wraps it)."""
        loss, grad = self._loss_grad(W)
        with torch.no_grad():
            W.sub_(self.step_size * grad)
            W.copy_(F.normalize(W, dim=-1))
        return {"reg": loss}

    def state_dict(self) -> dict[str, Any]:
        return {"label_sets": self.label_sets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.label_sets = state["label_sets"]
        self._counts = None
