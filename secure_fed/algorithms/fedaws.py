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
from secure_fed.algorithms.regularizers import spreadout, spreadout_top_k
from secure_fed.catalog import ALGORITHMS as CATALOG


def regularizer_step(W: torch.Tensor, loss_fn, step_size: float) -> float:
    """W ← normalize(W − step_size·∇loss(W)) in place; returns the loss before the step."""
    Wv = W.detach().clone().requires_grad_(True)
    loss = loss_fn(Wv)
    (grad,) = torch.autograd.grad(loss, Wv)
    with torch.no_grad():
        W.sub_(step_size * grad)
        W.copy_(F.normalize(W, dim=-1))
    return float(loss.detach())


class FedAwS(Algorithm):
    name = "fedaws"
    description = CATALOG["fedaws"]
    trains_rows = True

    def server_step(self, W: torch.Tensor, round_idx: int, participating: torch.Tensor) -> dict[str, float]:
        cfg = self.cfg
        if cfg.negative_mining:  # eq. 8: outer sum over this round's classes 𝔆ᵗ
            fn = lambda V: spreadout_top_k(V, cfg.k, classes=participating)  # noqa: E731
        else:
            fn = lambda V: spreadout(V, cfg.margin)  # noqa: E731
        reg = regularizer_step(W, fn, cfg.lam * cfg.reg_lr)
        return {"reg": reg}
