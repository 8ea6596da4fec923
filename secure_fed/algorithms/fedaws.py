"""FedAwS: Federated Averaging with Spreadout (Yu et al., ICML 2020, Algorithm 1).

After averaging, the server takes one step on the spreadout regulariser with
stochastic negative mining (FedAwS eq. 8)::

    W ← W − λ·η·∇ reg_sp^top(W)

with η = ``reg_lr`` and λ = ``lam`` (the learning-rate multiplier), over each
class's ``k`` nearest classes. Rows are renormalised to unit length after the
step (the model only ever uses normalised rows).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from secure_fed.algorithms.base import Algorithm
from secure_fed.algorithms.regularizers import outer_blocks, spreadout, spreadout_top_k
from secure_fed.catalog import ALGORITHMS as CATALOG


def regularizer_step(W: torch.Tensor, loss_fn, step_size: float, *, blocks: list[torch.Tensor] | None = None) -> float:
    """W ← normalize(W − step_size·∇loss(W)) in place; returns the loss before the step.

    With ``blocks`` (a top-k regulariser's outer classes split by
    :func:`~secure_fed.algorithms.regularizers.outer_blocks`), ``loss_fn(V, rows)`` is the outer sum over
    ``rows`` only: the loss and its gradient are summed block by block, so the (pairs × d) tensors of one
    backward stay block-sized (AmazonCat-13K at K = 50: 666,500 pairs × 512 floats a tensor otherwise)."""
    Wv = W.detach().clone().requires_grad_(True)
    if blocks is None:
        loss = loss_fn(Wv)
        (grad,) = torch.autograd.grad(loss, Wv)
        total = float(loss.detach())
    else:
        grad, total = torch.zeros_like(Wv), 0.0
        for rows in blocks:
            loss = loss_fn(Wv, rows)
            (g,) = torch.autograd.grad(loss, Wv)
            grad += g
            total += float(loss.detach())
    with torch.no_grad():
        W.sub_(step_size * grad)
        W.copy_(F.normalize(W, dim=-1))
    return total


class FedAwS(Algorithm):
    name = "fedaws"
    description = CATALOG["fedaws"]
    trains_rows = True

    def server_step(self, W: torch.Tensor, round_idx: int, participating: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg
        if cfg.negative_mining:  # eq. 8: outer sum over this round's classes 𝔆ᵗ, block by block
            blocks = outer_blocks(participating, cfg.k, W.shape[1])
            fn = lambda V, rows: spreadout_top_k(V, cfg.k, classes=rows)  # noqa: E731
            return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr, blocks=blocks)}
        fn = lambda V: spreadout(V, cfg.margin)  # noqa: E731
        return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr)}
