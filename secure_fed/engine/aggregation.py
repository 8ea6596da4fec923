"""Round aggregation: what the server gets out of one round's client replies.

A round's replies reduce to one :class:`Aggregate` (sums, never individual
updates). :class:`PlainRound` reduces plaintext replies; protocol layers wrap
it (``secure_fed.engine.layers.RoundWrapper``): secure aggregation and CKKS replace the
reduction of the wire messages, DP post-processes the sums.

:class:`UpdateLayout` packs one client's update into a flat vector
``[w·Δθ | w | row deltas scattered into C×d | row counts (C) | loss | 1]`` so a
protocol can sum vectors without knowing what they hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from secure_fed.algorithms.base import ClientData, ClientFn, Payload
from secure_fed.errors import RoundAborted
from secure_fed.models.group_updates import DeferredDelta, UpdateGroup
from secure_fed.models.sparse_rows import RowSparseDelta, dense_delta


@dataclass
class Aggregate:
    """Sums over one round's surviving clients.

    Attributes:
        theta_sum: Σ_c w_c·Δθ_c per parameter.
        weight_sum: Σ_c w_c (w_c = 1, the client's example count, or the weight its reply carries).
        row_sum: (C, d) Σ of the clients' own row deltas, at their rows.
        row_count: (C,) how many clients contributed to each row.
        loss_sum: Σ_c of the clients' mean training losses.
        num_clients: clients whose update is in the sums.
        theta_denominator / row_denominator: set by DP (fixed denominators);
            otherwise the engine divides by ``weight_sum`` / ``row_count``.
    """

    theta_sum: dict[str, torch.Tensor]
    weight_sum: float
    row_sum: torch.Tensor
    row_count: torch.Tensor
    loss_sum: float
    num_clients: int
    theta_denominator: float | None = None
    row_denominator: torch.Tensor | None = None
    notes: dict = field(default_factory=dict)

    def theta_mean(self) -> dict[str, torch.Tensor]:
        den = self.theta_denominator if self.theta_denominator is not None else self.weight_sum
        return {n: s / max(den, 1e-12) for n, s in self.theta_sum.items()}

    def rows_mean(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row deltas, mask of rows to update)."""
        if self.row_denominator is not None:
            den = self.row_denominator
            mask = den > 0
        else:
            den, mask = self.row_count, self.row_count > 0
        return self.row_sum / den.clamp(min=1e-12).unsqueeze(1), mask


def client_weight(reply: Payload, weighting: str) -> float:
    """The client's weight in the round's sums: the weight its reply carries when the algorithm has clients
    report one (an uplink key ``weight`` it declares, e.g. FLAG's eq. 2), else by ``training.aggregation``."""
    if "weight" in reply:
        return float(reply["weight"])
    return float(reply["num_examples"]) if weighting == "num_examples" else 1.0


class FlatUpdate:
    """A client's flattened update (:meth:`UpdateLayout.flat_view`) as pieces ``(offset, values, weight)``: slicing
    it, ``u[a:b]``, gives the float64 vector ``weight · float64(values)`` over ``[a, b)``, and nothing of the whole
    vector's size is built unless the whole is asked for."""

    def __init__(self, pieces: list[tuple[int, np.ndarray, float]], size: int):
        self.pieces, self.size = pieces, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, sl: slice) -> np.ndarray:
        a, b, step = sl.indices(self.size)
        if step != 1:
            raise IndexError("a flat update is read in contiguous slices")
        out = np.zeros(max(0, b - a), dtype=np.float64)
        for start, values, w in self.pieces:
            lo, hi = max(a, start), min(b, start + len(values))
            if lo < hi:
                dst = out[lo - a : hi - a]
                dst[...] = values[lo - start : hi - start]  # exact: float32 or float64 into float64
                if w != 1.0:
                    dst *= w  # in place: the same values as w · float64(Δ)
        return out


@dataclass(frozen=True)
class UpdateLayout:
    """Where each part of a client's update sits in its flat vector."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    num_rows: int
    dim: int
    #: reply keys holding a tensor of W's shape that is added to every row (declared with the ``FullTable``
    #: message rule, e.g. a client's DP noise share); the layout never names them itself
    full_table_keys: tuple[str, ...] = ()

    @classmethod
    def for_model(
        cls, theta: dict[str, torch.Tensor], num_rows: int, dim: int, *, full_table_keys: tuple[str, ...] = ()
    ) -> UpdateLayout:
        """``num_rows = 0`` for a model family without a row table."""
        return cls(tuple(theta), tuple(tuple(t.shape) for t in theta.values()), num_rows, dim, tuple(full_table_keys))

    def segments(self) -> dict[str, slice]:
        """Named slices: one per θ parameter, then ``rows`` (deltas and counts) and ``meta`` (w, loss, 1)."""
        out, o = {}, 0
        for n, s in zip(self.names, self.shapes, strict=True):
            k = int(np.prod(s))
            out[n] = slice(o, o + k)
            o += k
        out["rows"] = slice(o, o + self.num_rows * (self.dim + 1))
        o += self.num_rows * (self.dim + 1)
        out["meta"] = slice(o, o + 3)
        return out

    @property
    def size(self) -> int:
        return self.segments()["meta"].stop

    def flatten(self, reply: Payload, weighting: str) -> np.ndarray:
        """Client side: the reply as one float64 vector (weights applied)."""
        return self.flat_view(reply, weighting)[: self.size]

    def flat_view(self, reply: Payload, weighting: str) -> FlatUpdate:
        """Client side: :meth:`flatten`'s vector, read a slice at a time (``view[a:b]``) without building it: each
        θ parameter stays the reply's own tensor until a slice of it is read; the rows (C·(d + 1) values) and the
        meta slots are built whole."""
        w = client_weight(reply, weighting)
        seg = self.segments()
        pieces: list[tuple[int, np.ndarray, float]] = []
        for n in self.names:
            t = dense_delta(reply["theta_delta"][n]).detach().cpu()
            pieces.append((seg[n].start, (t if t.dtype in (torch.float32, torch.float64) else t.double()).numpy().ravel(), w))
        tail = np.zeros(seg["meta"].stop - seg["rows"].start, dtype=np.float64)  # rows (deltas, counts), then meta
        deltas = tail[: self.num_rows * self.dim].reshape(self.num_rows, self.dim)
        counts = tail[self.num_rows * self.dim : self.num_rows * (self.dim + 1)]
        if "rows_delta" in reply:
            ids = np.asarray(torch.as_tensor(reply["row_ids"]).cpu()).reshape(-1)
            deltas[ids] += reply["rows_delta"].detach().double().cpu().numpy()
            counts[ids] += 1.0
        for key in self.full_table_keys:  # e.g. a client's DP noise share on every row (distributed noise)
            if key in reply:
                deltas += reply[key].detach().double().cpu().numpy()
        tail[-3:] = (w, float(reply["loss"]), 1.0)
        pieces.append((seg["rows"].start, tail, 1.0))
        return FlatUpdate(pieces, self.size)

    def unflatten_sum(self, v: np.ndarray, device: torch.device) -> Aggregate:
        """Server side: a summed vector back into an :class:`Aggregate`."""
        seg = self.segments()
        theta = {
            n: torch.from_numpy(np.ascontiguousarray(v[seg[n]]).reshape(s)).float().to(device)
            for n, s in zip(self.names, self.shapes, strict=True)
        }
        rows = v[seg["rows"]]
        row_sum = torch.from_numpy(np.ascontiguousarray(rows[: self.num_rows * self.dim]).reshape(self.num_rows, self.dim))
        row_count = torch.from_numpy(np.ascontiguousarray(rows[self.num_rows * self.dim :]))
        w, loss, n = v[seg["meta"]]
        return Aggregate(
            theta_sum=theta,
            weight_sum=float(w),
            row_sum=row_sum.float().to(device),
            row_count=row_count.round().float().to(device),
            loss_sum=float(loss),
            num_clients=int(round(n)),
        )


class RoundSession:
    """One round's aggregation. The base class reduces plaintext replies.

    ``cohort`` are the clients that train this round; ``client_mod`` wraps the
    client function (client side); ``submit`` takes each wire message;
    ``finish`` returns the round's :class:`Aggregate`; ``post`` applies this
    session's server-side post-processing to an aggregate computed elsewhere.
    """

    def __init__(self, *, cohort: list[int], theta: dict[str, torch.Tensor], W: torch.Tensor | None, weighting: str):
        """``W`` is the row table, or None for a model family without one (the row sums are then empty)."""
        self.cohort = list(cohort)
        #: the fewest client updates a completed round's sum can hold (set by secure-sum layers; None: unknown)
        self.min_summands: int | None = None
        self.weighting = weighting
        self.device = next(iter(theta.values())).device
        self._theta_sum = {n: torch.zeros_like(t) for n, t in theta.items()}
        self._row_sum = torch.zeros_like(W) if W is not None else torch.zeros(0, 0, device=self.device)
        self._row_cnt = torch.zeros(self._row_sum.shape[0], device=self.device)
        self._w = 0.0
        self._loss = 0.0
        self._n = 0
        #: cohort clients whose update will not arrive (client id → why), see :meth:`drop`
        self.dropped: dict[int, str] = {}
        #: deferred updates not summed yet: (group, parameter) → (group, client index in the group → weight)
        self._deferred: dict[tuple[int, str], tuple[UpdateGroup, dict[int, float]]] = {}

    def drop(self, cid: int, reason: str) -> None:
        """A cohort client whose update will not arrive (its node failed, or did not answer in time): the round
        sums the others (partial aggregation). A sum that must hold at least ``min_summands`` updates (a secure sum
        whose noise shares or threshold count on them) aborts the round when fewer can arrive."""
        self.dropped[int(cid)] = reason
        left = len(self.cohort) - len(self.dropped)
        need = max(1, self.min_summands or 0)
        if left < need:
            raise RoundAborted(
                f"client {cid} dropped out ({reason}): {left} of {len(self.cohort)} updates can arrive, fewer than the "
                f"{need} this round's sum needs"
            )

    def client_mod(self, fn: ClientFn) -> ClientFn:
        return fn

    def client_plan(self) -> list[dict]:
        """The client-side steps of this round as public data (``[{"op": name, **args}]``, innermost first), for
        a remote client that cannot receive :meth:`client_mod`'s closure; the base session adds none."""
        return []

    def submit(self, cid: int, reply: Payload) -> None:
        w = client_weight(reply, self.weighting)
        for n, d in reply["theta_delta"].items():
            if isinstance(d, RowSparseDelta):  # the columns the client touched: a streaming sum of those only
                d.add_to(self._theta_sum[n], alpha=w)
            elif isinstance(d, DeferredDelta):  # pooled with its group's; summed when the group's last one arrives
                self._pool(n, d, w)
            else:
                self._theta_sum[n].add_(d.to(self.device), alpha=w)
        if "rows_delta" in reply:
            ids = torch.as_tensor(reply["row_ids"], device=self.device)
            self._row_sum.index_add_(0, ids, reply["rows_delta"].to(self.device))
            self._row_cnt.index_add_(0, ids, torch.ones(len(ids), device=self.device))
        self._w += w
        self._loss += float(reply["loss"])
        self._n += 1

    def _pool(self, n: str, d: DeferredDelta, w: float) -> None:
        if d.name != n or tuple(d.shape) != tuple(self._theta_sum[n].shape):
            raise ValueError(f"a deferred update of {d.name!r} {d.shape} sent as '{n}'")
        group, weights = self._deferred.setdefault((id(d.group), n), (d.group, {}))
        if d.index in weights:
            raise ValueError(f"client {d.index} of a trained group sent its update of '{n}' twice")
        weights[d.index] = w
        if len(weights) == group.size:  # the group's sum now, so its history is freed with the group
            del self._deferred[(id(d.group), n)]
            group.add_weighted_sum(self._theta_sum[n], n, weights)

    def finish(self) -> Aggregate:
        for (_, n), (group, weights) in self._deferred.items():  # groups some of whose updates came another way
            group.add_weighted_sum(self._theta_sum[n], n, weights)
        self._deferred.clear()
        return Aggregate(self._theta_sum, self._w, self._row_sum, self._row_cnt, self._loss, self._n)

    def post(self, agg: Aggregate) -> Aggregate:
        return agg


__all__ = ["Aggregate", "ClientData", "RoundSession", "UpdateLayout", "client_weight"]
