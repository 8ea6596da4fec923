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
  W then stays fixed and clients train θ only.
"""

from __future__ import annotations

from typing import Any

import torch

from secure_fed.algorithms.base import Algorithm, SetupContext
from secure_fed.algorithms.client import token_client
from secure_fed.algorithms.fedaws import regularizer_step
from secure_fed.algorithms.label_sets import merge_label_sets
from secure_fed.algorithms.regularizers import (
    cooccurrence_counts,
    correlation_gamma,
    correlation_sigma,
    correlation_top_k,
    fixed_embedding_reg,
)
from secure_fed.catalog import ALGORITHMS as CATALOG


class _LabelSetMixin:
    """Runs label-set collection and keeps the merged label sets."""

    #: label-set collection: the server asks for a tokenizer's tokens; a client answers with tokens and its label
    downlink_keys = Algorithm.downlink_keys | {"tokenizer"}
    uplink_keys = Algorithm.uplink_keys | {"tokens", "label"}

    label_sets: torch.Tensor | None = None

    def collect_label_sets(self, ctx: SetupContext) -> dict[str, Any]:
        replies = ctx.query(lambda cid: {"tokenizer": self.cfg.tokenizer}, token_client)
        msgs = [(r["tokens"], r["label"]) for _, r in replies]
        self.label_sets = merge_label_sets(msgs, ctx.num_labels)
        sent = sum(len(t) for t, _ in msgs)
        return {
            "label_sets": int(self.label_sets.shape[0]),
            "tokens_received": sent,
            "mean_labels_per_set": float(self.label_sets.sum(1).mean()),
        }


class FedALC(_LabelSetMixin, Algorithm):
    name = "fedalc"
    description = CATALOG["fedalc"]
    trains_rows = True

    def setup(self, ctx: SetupContext) -> dict[str, Any]:
        facts = self.collect_label_sets(ctx)
        self._build_weights(ctx.num_labels)
        return facts

    def _build_weights(self, num_labels: int) -> None:
        sigma = correlation_sigma(self.label_sets)
        w = correlation_gamma(sigma) if self.cfg.normalize_gamma else sigma
        scale = (num_labels - 1) if self.cfg.gamma_scale == "classes_minus_one" else float(self.cfg.gamma_scale)
        self.weights = (scale * w).to(torch.float32).to(self.device)

    def server_step(self, W: torch.Tensor, round_idx: int, participating: torch.Tensor) -> dict[str, float]:
        return self.correlation_update(W)

    def correlation_update(self, W: torch.Tensor) -> dict[str, float]:
        """One step on eq. 11 with the γ weights. The ``dp`` layer replaces this with DP-SGD over label sets."""
        cfg = self.cfg
        fn = lambda V: correlation_top_k(V, self.weights, cfg.k, cfg.margin)  # noqa: E731
        return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr)}

    def state_dict(self) -> dict[str, Any]:
        return {"label_sets": self.label_sets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.label_sets = state["label_sets"]
        self._build_weights(self.label_sets.shape[1])


class FedALCFixed(_LabelSetMixin, Algorithm):
    name = "fedalc_fixed"
    description = CATALOG["fedalc_fixed"]
    trains_rows = False

    def setup(self, ctx: SetupContext) -> dict[str, Any]:
        facts = self.collect_label_sets(ctx)
        cfg = self.cfg
        A, n_u, n_all = cooccurrence_counts(self.label_sets)
        A, n_u = A.to(ctx.device), n_u.to(ctx.device)
        self._reg_fc = lambda V: fixed_embedding_reg(V, A, n_u, n_all, alpha=cfg.alpha, beta=cfg.beta, margin=cfg.margin)  # noqa: E731
        first, done = None, 0
        for i in range(cfg.fixed_steps):
            out = self.pretrain_update(ctx.W, i)
            if out is None:  # the dp layer's budget is spent
                break
            first = out["reg"] if first is None else first
            done += 1
        facts.update({"reg_fc_first": first, "reg_fc_last": float(self._reg_fc(ctx.W).detach()), "fixed_steps_done": done})
        return facts

    def pretrain_update(self, W: torch.Tensor, step: int) -> dict[str, float] | None:
        """One step of W ← W − λη∇reg_fc(W) (eq. 12). The ``dp`` layer replaces this with DP-SGD over label sets."""
        return {"reg": regularizer_step(W, self._reg_fc, self.cfg.lam * self.cfg.fixed_lr)}

    def state_dict(self) -> dict[str, Any]:
        return {"label_sets": self.label_sets}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.label_sets = state["label_sets"]
