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
from secure_fed.algorithms.params.fedaws import FedAwSParams
from secure_fed.algorithms.regularizers import nearest_classes, outer_blocks, spreadout, spreadout_top_k


def regularizer_step(
    W: torch.Tensor,
    loss_fn,
    step_size: float,
    *,
    blocks: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> float:
    """W ← normalize(W − step_size·∇loss(W)) in place; returns the loss before the step.

    With ``blocks`` — pairs (outer classes, their neighbours) of a top-k regulariser, from
    :func:`~secure_fed.algorithms.regularizers.outer_blocks` — the loss is the sum over the blocks of
    ``loss_fn(V, rows, nn_idx, labels)``: V holds only the rows the block reads (its outer classes and their
    neighbours), ``rows``/``nn_idx`` index V, ``labels`` maps V's rows to label ids. Gradients are summed into one
    table and the step moves, and renormalises, the rows that took part. So no autograd graph spans the whole of W
    (Amazon-670K: 1.2 GB a copy) and a block's (pairs × d) tensors stay block-sized; the step equals the
    one-expression step (tested in fp64)."""
    if blocks is None:
        Wv = W.detach().clone().requires_grad_(True)
        loss = loss_fn(Wv)
        (grad,) = torch.autograd.grad(loss, Wv)
        with torch.no_grad():
            W.sub_(step_size * grad)
            W.copy_(F.normalize(W, dim=-1))
        return float(loss.detach())
    grad, total = torch.zeros_like(W), 0.0
    touched = torch.zeros(W.shape[0], dtype=torch.bool, device=W.device)
    for rows, nn_idx in blocks:
        labels, local = torch.unique(torch.cat([rows, nn_idx.reshape(-1)]), return_inverse=True)
        V = W.detach().index_select(0, labels).requires_grad_(True)
        loss = loss_fn(V, local[: len(rows)], local[len(rows) :].view(nn_idx.shape), labels)
        (g,) = torch.autograd.grad(loss, V)
        grad.index_add_(0, labels, g)
        touched[labels] = True
        total += float(loss.detach())
    with torch.no_grad():
        idx = touched.nonzero().squeeze(1)
        W[idx] = F.normalize(W[idx] - step_size * grad[idx], dim=-1)
    return total


class FedAwS(Algorithm):
    params = FedAwSParams

    def server_step(self, W: torch.Tensor, round_idx: int, participating: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg
        if cfg.negative_mining:  # eq. 8: outer sum over this round's classes 𝔆ᵗ, block by block
            blocks = outer_blocks(participating, cfg.k, W.shape[1])
            if len(blocks) == 1:  # one expression (Bibtex-sized C)
                fn = lambda V: spreadout_top_k(V, cfg.k, classes=participating)  # noqa: E731
                return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr)}
            nn_idx = nearest_classes(W, cfg.k, rows=participating)
            pairs = [(rows, nn) for rows, nn in zip(blocks, torch.split(nn_idx, [len(b) for b in blocks]), strict=True)]
            fn = lambda V, rows, nn, labels: spreadout_top_k(V, cfg.k, classes=rows, nn_idx=nn)  # noqa: E731
            return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr, blocks=pairs)}
        fn = lambda V: spreadout(V, cfg.margin)  # noqa: E731
        return {"reg": regularizer_step(W, fn, cfg.lam * cfg.reg_lr)}
