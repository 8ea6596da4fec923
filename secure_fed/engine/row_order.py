"""W's row order: the simulator's bookkeeping when a layer re-indexes labels (e.g. keyed label pseudonyms).

Label l lives in row ``perm[l]``; the clients' labels, the test labels, the guard's row ownership and the layers'
public per-row divisors follow the order. The clients keep the order on their side (it is saved in
``clients.pt``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def client_rows(fed) -> dict[int, set[int]]:
    """Each client's own rows of W: the rows of the labels it holds (after any keyed row order)."""
    return {c.client_id: {int(i) for i in c.known_labels} for c in fed.clients}


def clients_per_row(fed, num_labels: int) -> torch.Tensor:
    """A public count of the clients each row of W is averaged over (a DP layer's fixed per-row divisor): 1 where
    each label has its own client (positive-only: structural), else every client of the federation (which clients
    hold a label is a fact of their data, so it may not divide a DP sum)."""
    one_each = all(s.label is not None for s in fed.shards)
    n = 1 if one_each else len(fed.clients)
    return torch.full((num_labels,), n, dtype=torch.long)


class RowOrder:
    """The current label → row order (``perm``; None: the identity) and what follows it."""

    def __init__(self, fed, num_labels: int, guard, stack_env: Any):
        self.fed, self.num_labels, self.guard, self.stack_env = fed, num_labels, guard, stack_env
        self.perm: np.ndarray | None = None  #: simulator's view: label l lives in row perm[l]

    def apply(self, perm) -> None:
        """Re-index labels: label l now lives in row perm[l]."""
        perm = np.asarray(perm, dtype=np.int64)
        if sorted(perm.tolist()) != list(range(self.num_labels)):
            raise ValueError("a row order must be a bijection on the labels")
        self.perm = perm if self.perm is None else perm[self.perm]
        fed = self.fed
        t = torch.as_tensor(perm)
        for c in fed.clients:
            c.known_labels = t[c.known_labels]
        y = fed.y_test.tocsc()[:, np.argsort(perm)].tocsr()  # column perm[l] holds label l
        fed.y_test = y
        for c, rows in zip(fed.clients, fed.client_test or [], strict=False):
            if c.eval_y is not None:
                c.eval_y = y[rows].toarray()
        self.guard.set_client_rows(client_rows(fed))
        self.stack_env.clients_per_row = clients_per_row(fed, self.num_labels)
