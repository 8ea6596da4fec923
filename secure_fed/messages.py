"""Message rules: what each key of a message may carry, declared by whoever adds the key.

An algorithm declares the rules of the keys it sends and receives (:attr:`Algorithm.downlink_rules`,
:attr:`Algorithm.uplink_rules`), a protocol layer those of its own keys (``LayerSpec.downlink_rules`` …).
The :class:`~secure_fed.engine.guard.MessageGuard` refuses any key nobody declared and checks every
declared one with its rule, so the core never spells a layer's key.

The rules about the server's model come from what the algorithm lets a client see of each named server
tensor (:class:`Visibility`): :class:`Params` carries a whole tensor group (``theta``), only when it is
visible to every client; :class:`Rows` carries rows of a row table (``W``) with their ids, only the
client's own rows unless the table is visible whole.

Rules are plain dataclasses (no torch at import), so layer specs can declare them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

#: the longest byte string a token, pseudonym or other opaque identifier may be
MAX_TOKEN_BYTES = 64


class Visibility(str, Enum):
    """What a client may receive of one named server tensor."""

    ALL = "all"  #: the whole tensor (every participating client)
    OWN_ROWS = "own_rows"  #: only the rows of the labels the client holds
    SERVER = "server"  #: nothing: the server keeps it


@dataclass(frozen=True)
class CheckContext:
    """What a rule may use: the server's tensor shapes, what the algorithm lets clients see, this client's rows."""

    shapes: dict[str, dict[str, tuple[int, ...]] | tuple[int, ...]]
    visibility: dict[str, Visibility]
    own_rows: frozenset[int]


class Rule:
    """Base class; :meth:`check` returns None when the value is allowed, else why not (one clause)."""

    def check(self, key: str, value: Any, msg: dict[str, Any], ctx: CheckContext) -> str | None:
        raise NotImplementedError


@dataclass(frozen=True)
class Params(Rule):
    """A dict holding exactly the tensors of server group ``group`` (updates: their deltas), each of its shape."""

    group: str = "theta"
    #: an entry may be a :class:`~secure_fed.models.sparse_rows.RowSparseDelta` (an update of a sparse-input table
    #: as the columns the client touched; uplink only)
    row_sparse: bool = False
    #: an entry may be a :class:`~secure_fed.models.group_updates.DeferredDelta` (an update its training group
    #: forms when read; uplink only)
    deferred: bool = False

    def check(self, key, value, msg, ctx):
        import torch

        from secure_fed.models.group_updates import DeferredDelta
        from secure_fed.models.sparse_rows import RowSparseDelta

        if ctx.visibility.get(self.group) != Visibility.ALL:
            return f"'{key}' carries {self.group}, which the algorithm does not let clients see whole"
        shapes = ctx.shapes[self.group]
        if not isinstance(value, dict) or set(value) != set(shapes):
            return f"'{key}' must hold exactly the parameters of {self.group}"
        for n, v in value.items():
            if self.row_sparse and isinstance(v, RowSparseDelta):
                if (why := _row_sparse_problem(v, shapes[n])) is not None:
                    return f"'{key}' entry '{n}' {why}"
            elif self.deferred and isinstance(v, DeferredDelta):
                if v.name != n or tuple(v.shape) != tuple(shapes[n]) or not v.dtype.is_floating_point:
                    return f"'{key}' entry '{n}' is a deferred update of another parameter, shape or dtype"
            elif not isinstance(v, torch.Tensor) or tuple(v.shape) != shapes[n]:
                return f"'{key}' entry '{n}' has the wrong shape"
        return None


def _row_sparse_problem(v, shape: tuple[int, ...]) -> str | None:
    """Why a row-sparse update does not fit a parameter of ``shape`` (None: it does)."""
    import torch

    if len(shape) != 2 or tuple(v.shape) != tuple(shape):
        return "has the wrong shape"
    cols, values = v.cols, v.values
    if not isinstance(cols, torch.Tensor) or cols.dtype != torch.int64 or cols.dim() != 1:
        return "has column ids that are not a 1-d int64 tensor"
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != (len(cols), shape[0]):
        return "has values that do not match its columns"
    if not values.dtype.is_floating_point:
        return "has values that are not floating point"
    if len(cols) and (int(cols[0]) < 0 or int(cols[-1]) >= shape[1] or bool((cols[1:] <= cols[:-1]).any())):
        return "has column ids that are not distinct, sorted and in range"
    return None


@dataclass(frozen=True)
class Rows(Rule):
    """Rows of the row table ``group`` (or their deltas), with their row ids in ``ids``."""

    group: str = "W"
    ids: str = "row_ids"

    def check(self, key, value, msg, ctx):
        import torch

        vis = ctx.visibility.get(self.group)
        if vis not in (Visibility.ALL, Visibility.OWN_ROWS):
            return f"'{key}' carries rows of {self.group}, which the algorithm does not let clients see"
        if msg.get(self.ids) is None:
            return f"'{key}' needs '{self.ids}'"
        ids = [int(i) for i in torch.as_tensor(msg[self.ids]).reshape(-1)]
        if vis == Visibility.OWN_ROWS and (extra := set(ids) - ctx.own_rows):
            return f"class rows {sorted(extra)[:5]} do not belong to this client"
        dim = ctx.shapes[self.group][1]
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (len(ids), dim):
            return f"'{key}' must have shape ({len(ids)}, {dim})"
        return None


@dataclass(frozen=True)
class RowIds(Rule):
    """Row ids of ``group`` (checked with the rows they index; alone, they must still be the client's own)."""

    group: str = "W"

    def check(self, key, value, msg, ctx):
        import torch

        ids = {int(i) for i in torch.as_tensor(value).reshape(-1)}
        if ctx.visibility.get(self.group) == Visibility.OWN_ROWS and (extra := ids - ctx.own_rows):
            return f"class rows {sorted(extra)[:5]} do not belong to this client"
        return None


@dataclass(frozen=True)
class FullTable(Rule):
    """A tensor shaped like the whole row table ``group`` that the client adds to every row, e.g. a DP noise
    share (it is independent of the client's data). Packed into the summed vector with the row deltas."""

    group: str = "W"

    def check(self, key, value, msg, ctx):
        import torch

        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(ctx.shapes[self.group]):
            return f"'{key}' must have the shape of {self.group}"
        return None


@dataclass(frozen=True)
class OwnLabel(Rule):
    """One label index, which must be one of the client's own rows."""

    def check(self, key, value, msg, ctx):
        if isinstance(value, bool) or not isinstance(value, int) or value not in ctx.own_rows:
            return "a client may only report its own label"
        return None


@dataclass(frozen=True)
class Setting(Rule):
    """A flag or a name (e.g. which loss or tokenizer to use): public configuration, nothing else."""

    def check(self, key, value, msg, ctx):
        return None if isinstance(value, (bool, str)) else f"'{key}' must be a flag or a name"


@dataclass(frozen=True)
class Number(Rule):
    """One number (a count, a loss)."""

    def check(self, key, value, msg, ctx):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"'{key}' must be a number"


@dataclass(frozen=True)
class Vector(Rule):
    """One finite 1-D float tensor of at most ``max_len`` entries (a per-label statistic of the client, e.g. its label
    counts, that a DP mechanism bounds or an algorithm sums)."""

    max_len: int = 10_000_000

    def check(self, key, value, msg, ctx):
        import torch

        if not isinstance(value, torch.Tensor) or value.dim() != 1 or not value.is_floating_point():
            return f"'{key}' must be a 1-D float tensor"
        if value.numel() > self.max_len or not bool(torch.isfinite(value).all()):
            return f"'{key}' must hold at most {self.max_len} finite values"
        return None


@dataclass(frozen=True)
class ShortBytes(Rule):
    """One opaque byte string of at most ``max_bytes`` (a pseudonym, a public key)."""

    max_bytes: int = MAX_TOKEN_BYTES

    def check(self, key, value, msg, ctx):
        ok = isinstance(value, bytes) and len(value) <= self.max_bytes
        return None if ok else f"'{key}' must be a byte string of ≤ {self.max_bytes} bytes"


@dataclass(frozen=True)
class Indices(Rule):
    """Distinct non-negative integers in increasing order (a 1-D integer array): which pieces of a split message a
    client sent. Declare it only where the choice is a function of what the receiver already knows (e.g. CKKS
    ciphertexts chosen by the row ids the server sent the client)."""

    def check(self, key, value, msg, ctx):
        import numpy as np

        a = np.asarray(value)
        ok = a.ndim == 1 and a.dtype.kind in "iu" and (a.size == 0 or (a[0] >= 0 and bool(np.all(a[1:] > a[:-1]))))
        return None if ok else f"'{key}' must be increasing non-negative integers"


@dataclass(frozen=True)
class ByteList(Rule):
    """A list of byte strings of at most ``max_bytes`` each (instance tokens, label pseudonyms)."""

    max_bytes: int = MAX_TOKEN_BYTES

    def check(self, key, value, msg, ctx):
        if not isinstance(value, list) or any(not isinstance(t, bytes) or len(t) > self.max_bytes for t in value):
            return f"'{key}' must be a list of byte strings of ≤ {self.max_bytes} bytes"
        return None


@dataclass(frozen=True)
class Opaque(Rule):
    """A value the guard does not inspect (a layer's own protocol message whose content its layer checks,
    e.g. an encrypted key share). Declare it only for values that carry nothing about a client's data."""

    def check(self, key, value, msg, ctx):
        return None


Rules = dict[str, Rule]
