"""The server's model state: θ (every client gets it whole), the row table W (each client only its own rows, for
model families with one), the server's copy of the model module (to score θ), and the server optimisers.

The run object applies each round's aggregate here (:meth:`ModelState.apply`); evaluation reads it, the
checkpoint saves it. One handle shared by the run and its callbacks (``RunContext.model``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from secure_fed.engine.server_optimizers import ServerOptimizer
from secure_fed.models import mean_pairwise_cosine


@dataclass
class ModelState:
    """θ, W and what updates and scores them."""

    theta: dict[str, torch.Tensor]
    W: torch.Tensor | None
    #: the simulator's copy of the server's model (θ loaded into it to score; with FedLGT's label embeddings,
    #: computed like a client's from the public names)
    encoder: nn.Module
    family: Any  #: the model family (:mod:`secure_fed.models.families`): scores, row projection
    server_opt: ServerOptimizer  #: θ's server optimiser
    row_opt: ServerOptimizer  #: W's (used when ``server_optimizer.apply_to_rows`` is set)

    def server_tensors(self) -> dict[str, Any]:
        """The server's model as named tensors: ``theta`` (a parameter dict) and ``W`` when the family has rows."""
        return {"theta": self.theta, **({"W": self.W} if self.W is not None else {})}

    def tensor_shapes(self) -> dict[str, Any]:
        return {k: ({n: tuple(t.shape) for n, t in v.items()} if isinstance(v, dict) else tuple(v.shape))
                for k, v in self.server_tensors().items()}  # fmt: skip

    def finite(self) -> bool:
        """Whether θ and W are finite (else training diverged)."""
        tensors = [*self.theta.values(), *([self.W] if self.W is not None else [])]
        return all(bool(torch.isfinite(t).all()) for t in tensors)

    def mean_row_cosine(self) -> float | None:
        """Mean pairwise cosine of W's rows (1.0: collapse); None without a row table."""
        return None if self.W is None else mean_pairwise_cosine(self.W)

    def apply(self, agg, *, trains_rows: bool, rows_by_optimizer: bool) -> None:
        """The server step of a round's aggregate: the server optimiser on θ; with ``trains_rows`` W's rows some
        client updated get their mean update (through the row optimiser when ``rows_by_optimizer``) and are
        projected by the family."""
        self.server_opt.step(self.theta, agg.theta_mean())
        if trains_rows and self.W is not None:
            row_delta, seen = agg.rows_mean()
            if rows_by_optimizer:
                self.row_opt.step({"W": self.W}, {"W": row_delta}, masks={"W": seen})
            else:
                self.W[seen] += row_delta[seen]
            self.W[seen] = self.family.project_rows(self.W[seen])

    def load_theta(self, theta: dict[str, torch.Tensor]) -> None:
        """Copy ``theta`` into the server's model module, in eval mode (to score it)."""
        for n, p in self.encoder.named_parameters():
            p.copy_(theta[n])
        self.encoder.eval()
