"""Client updates that their training group forms: one client's when it is read, many clients' sum in one pass.

The vectorised executor trains a chunk of clients together and keeps, per layer, the clients' training history
(each step's layer inputs and −η·δ; :mod:`secure_fed.algorithms.batched_sgd`). A client's update of a Linear
weight is a product over its own history, Δ_i = Σ_t (−η δ_{i,t})ᵀ x_{i,t}, and the server's sum of the group's
updates, Σ_i w_i Δ_i, is the same kind of product over every client's history at once: a few large matrix
products per layer instead of one product, one cast and one addition of a full weight per client (Bibtex, 159
clients: about 135 against 270 ms a round in bf16, see the README's "Speed").

So in a run whose layers pass plaintext θ updates through to the server's sum untouched
(``training.deferred_updates``; secure sums, CKKS and client-level DP take only dense updates), a client's reply
holds each such update as a :class:`DeferredDelta`: its value is exactly the dense update (:meth:`~DeferredDelta.
to_dense`, formed on every read, the same product as before), and the round's plain sum
(:class:`~secure_fed.engine.aggregation.RoundSession`) pools a group's deferred updates and has the group add
their weighted sum (:meth:`UpdateGroup.add_weighted_sum`) once the last of them arrives.

Numerics: in fp32 the pooled sum equals the sum of the dense updates up to floating-point reassociation. Under
``precision: bf16`` the products run in bf16 (fp32 accumulation inside), so the pooled sum rounds each
product's output, and each client's weight times its −η·δ, to bf16 where the dense path rounds each client's
update; both are within about 0.2% (relative) of the exact sum of the same products (measured on Bibtex: 0.18%
dense, 0.21% pooled).

What the object holds: a reference to the group that trained it, and so to every member's training history (for
the first layer, their feature rows). Only the engine dereferences it (to form the update, or the group's sum);
everything else reads an update through :func:`~secure_fed.models.sparse_rows.dense_delta`. Since an object graph
in one process cannot be hidden, the engine defers updates only while nothing outside it holds the wire messages:
no registered callback (attack taps, canaries), no ``output.log_messages``; and a deferred update refuses to be
pickled (a saved message would carry the group).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


class UpdateGroup(ABC):
    """The clients that trained together, able to form their updates of the weights they hold as histories."""

    #: clients in the group (indices 0 … size − 1)
    size: int

    @abstractmethod
    def dense(self, index: int, name: str) -> torch.Tensor:
        """Client ``index``'s update of parameter ``name``, as a dense tensor of the parameter's dtype."""

    @abstractmethod
    def add_weighted_sum(self, target: torch.Tensor, name: str, weights: dict[int, float]) -> None:
        """``target += Σ_i weights[i] · Δ_i[name]`` over the group's clients ``i`` in ``weights`` (in place)."""


class DeferredDelta:
    """A client's update of one parameter, formed when read; its group can sum it with the others'."""

    __slots__ = ("group", "index", "name", "shape", "dtype")

    def __init__(self, group: UpdateGroup, index: int, name: str, shape: tuple[int, ...], dtype: torch.dtype):
        self.group, self.index, self.name = group, int(index), name
        self.shape, self.dtype = tuple(shape), dtype

    def to_dense(self) -> torch.Tensor:
        """The update as a dense tensor (formed now: each read computes it)."""
        return self.group.dense(self.index, self.name)

    def add_to(self, target: torch.Tensor, *, alpha: float = 1.0) -> torch.Tensor:
        """``target += alpha·Δ`` in place; returns ``target``."""
        if tuple(target.shape) != self.shape:
            raise ValueError(f"an update of shape {self.shape} added to a tensor of shape {tuple(target.shape)}")
        return target.add_(self.to_dense().to(target.device), alpha=alpha)

    def __reduce__(self):
        raise TypeError("a deferred update is not serialised (it refers to its whole training group); save dense_delta(d)")

    def __repr__(self) -> str:
        return f"DeferredDelta({self.name!r}, client {self.index} of its group, shape={self.shape})"


__all__ = ["DeferredDelta", "UpdateGroup"]
