"""Dirac canaries for the one-run audit (Steinke, Nasr & Jagielski 2023, white-box, gradient space).

Canary i is a single coordinate ``j_i`` of θ with a sign ``s_i``. It is inserted
with probability ½ (``included[i]``); an inserted canary rides on the update of
its owner client — whenever that client is sampled, ``s_i · norm`` is added to
coordinate ``j_i`` of its Δθ *before* any protocol layer, so client-level DP
clips it together with the client's own update. Flipping one inclusion bit
*replaces* one client's contribution (its update with or without the canary):
that is the replacement neighbouring relation, which add/remove client-level DP
at (ε, δ) covers at (2ε, (1 + e^ε)δ) by group privacy over two changes. The
audit's lower bound is compared with that.

Under DP-SGD in client training (``privacy.local``) the canaries are *instances* instead
(``unit="instance"``): canary i is one extra training example of its owner client whose clipped
per-sample gradient is the Dirac vector −s_i·C·e_{j_i} (norm C, the clip norm, so clipping leaves it
whole). In each of the owner's DP-SGD steps it joins the batch with the step's sampling rate q, like
every example, and its gradient enters the clipped sum before the noise
(:meth:`DiracCanaries.wrap_privatizer`). Flipping its bit adds or removes one instance: the
add/remove relation of the instance unit, so the bound is compared with that unit's (ε, δ) directly.

The coordinates, signs, owners and bits are the auditor's secret: drawn from the
operating system's entropy (never the run's public seed) and kept in
``RUN_DIR/private/checkpoints/auditor.pt``.

The score of canary i after training is ``s_i · (θ_T − θ_0)[j_i]``. The auditor
keeps the coordinates, signs and bits on its own side (``RUN_DIR/auditor.pt``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from secure_fed.plugin_api.attacks import ClientFn, dense_delta

#: the canaries' name for the owner client's class row (instance canaries in the positive-only setting)
ROWS = "rows"


class DiracCanaries:
    """``m`` canaries in the flattened θ (parameters in their named order)."""

    def __init__(
        self,
        *,
        m: int,
        norm: float,
        theta_shapes: dict[str, tuple[int, ...]],
        num_clients: int,
        seed: int | None = None,
        unit: str = "client",
        own_rows: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        """``seed`` None (the default) draws fresh OS entropy; an integer is for tests only. ``unit``: ``client``
        (update canaries) or ``instance`` (gradient canaries inside DP-SGD). ``own_rows`` (instance canaries of the
        positive-only setting, where each client trains its one class row): ``(row, W⁰)``, each client's row index
        in the released W and the initial W (public): the canaries' space then also holds the owner's row (the
        parameter ``rows``), the only trained tensor when the encoder is fixed."""
        if unit not in ("client", "instance"):
            raise ValueError(f"canary unit {unit!r}: client or instance")
        self.m, self.norm, self.unit = int(m), float(norm), unit
        theta_shapes = dict(theta_shapes)
        if own_rows is not None:  # every client's row: a canary there belongs to that row's client
            theta_shapes[ROWS] = (len(own_rows[0]), int(own_rows[1].shape[1]))
        self.names = list(theta_shapes)
        sizes = [int(np.prod(s)) for s in theta_shapes.values()]
        self.offsets = np.cumsum([0, *sizes])
        rng = np.random.default_rng(np.random.SeedSequence() if seed is None else [seed, 0xCA7A])
        self.coords = rng.choice(int(self.offsets[-1]), size=self.m, replace=False)
        self.signs = rng.choice(np.array([-1.0, 1.0]), size=self.m)
        self.included = rng.random(self.m) < 0.5
        self.owner = rng.integers(num_clients, size=self.m)
        #: the auditor's secret behind each canary's Poisson draws (instance canaries)
        self.sampling_key = int(rng.integers(2**63))
        #: row canaries: the owner's row in the released W, and its initial value at the canary's coordinate
        self.row, self.start, self.row_dim = None, None, None
        if own_rows is not None:
            rows, W0 = own_rows
            self.row_dim = int(W0.shape[1])
            at = [self._locate(int(j)) for j in self.coords]
            for i, (name, off) in enumerate(at):
                if name == ROWS:  # the coordinate's row decides its owner
                    self.owner[i] = off // self.row_dim
            self.row = np.asarray(rows)[self.owner]
            self.start = np.array([float(W0[r, off % self.row_dim]) if name == ROWS else 0.0
                                   for r, (name, off) in zip(self.row, at, strict=True)])  # fmt: skip

    def _locate(self, coord: int) -> tuple[str, int]:
        k = int(np.searchsorted(self.offsets, coord, side="right") - 1)
        return self.names[k], int(coord - self.offsets[k])

    def client_mod(self, fn: ClientFn) -> ClientFn:
        """Adds the inserted canaries a client owns to its Δθ (innermost: before DP clipping or masking)."""
        mine: dict[int, list[int]] = {}
        for i in np.flatnonzero(self.included):
            mine.setdefault(int(self.owner[i]), []).append(int(i))

        def with_canaries(payload, data):
            reply = fn(payload, data)
            own = mine.get(int(data.client_id))
            if not own:
                return reply
            delta = {n: dense_delta(t).clone(memory_format=torch.contiguous_format) for n, t in reply["theta_delta"].items()}
            for i in own:
                name, off = self._locate(int(self.coords[i]))
                delta[name].view(-1)[off] += float(self.signs[i]) * self.norm
            return {**reply, "theta_delta": delta}

        return with_canaries

    def wrap_privatizer(self, cid: int, round_idx: int, privatizer):
        """Instance canaries: the owner's DP-SGD gets its inserted canaries as extra examples, each sampled with the
        step's rate q and contributing the clipped gradient −s·C·e_j to the sum before the noise."""
        if self.unit != "instance":
            return privatizer
        own = [int(i) for i in np.flatnonzero(self.included & (self.owner == cid))]
        if not own:
            return privatizer
        return _CanaryPrivatizer(privatizer, self, own, cid, round_idx)

    def scores(
        self,
        theta: dict[str, torch.Tensor],
        theta0: dict[str, torch.Tensor],
        W: torch.Tensor | None = None,
        W_ref: torch.Tensor | None = None,
    ) -> np.ndarray:
        """``s_i · (θ − θ⁰)[j_i]`` for every canary (inserted or not); a row canary's ``s_i · (W − W⁰)[row, j_i]``,
        or ``s_i · (W − W_ref)[row, j_i]`` against a reference model (the audit's noise-free replay)."""
        out = np.zeros(self.m)
        for i, coord in enumerate(self.coords):
            name, off = self._locate(int(coord))
            if name == ROWS:
                if W is None:
                    raise ValueError("row canaries are scored on W: the view has none")
                ref = float(self.start[i]) if W_ref is None else float(W_ref[int(self.row[i]), off % self.row_dim])
                out[i] = float(W[int(self.row[i]), off % self.row_dim]) - ref
            else:
                out[i] = float(theta[name].reshape(-1)[off]) - float(theta0[name].reshape(-1)[off])
        return self.signs * out

    def state_dict(self) -> dict[str, Any]:
        return {
            "m": self.m, "norm": self.norm, "names": self.names, "offsets": self.offsets, "coords": self.coords,
            "signs": self.signs, "included": self.included, "owner": self.owner, "unit": self.unit,
            "sampling_key": self.sampling_key, "row": self.row, "start": self.start, "row_dim": self.row_dim,
        }  # fmt: skip

    @classmethod
    def from_state_dict(cls, st: dict[str, Any]) -> DiracCanaries:
        c = cls.__new__(cls)
        c.unit, c.sampling_key, c.row, c.start, c.row_dim = "client", 0, None, None, None
        for k, v in st.items():
            setattr(c, k, v)
        return c


class _CanaryPrivatizer:
    """A client's DP-SGD with the auditor's inserted instance canaries among its examples."""

    def __init__(self, inner, canaries: DiracCanaries, own: list[int], cid: int, round_idx: int):
        self.inner, self.c, self.own, self.cid, self.round = inner, canaries, own, cid, round_idx
        self.sample_rate = float(inner.sample_rate)
        self.clip_norm = float(inner.clip_norm)

    def steps_per_epoch(self) -> int:
        return self.inner.steps_per_epoch()

    def batch(self, n: int, step: str):
        return self.inner.batch(n, step)

    def clip_scales(self, copies):
        return self.inner.clip_scales(copies)

    def factors(self, norms, scales=None):
        return self.inner.factors(norms, scales)

    def instance_uniforms(self, keys, m: int, step: str):
        return self.inner.instance_uniforms(keys, m, step)

    @property
    def applies_weight_terms(self) -> bool:
        return self.inner.applies_weight_terms

    def clip_sum(self, grads, scales=None):
        return self.inner.clip_sum(grads, scales)

    def finish(self, sums, step: str):
        tag = int.from_bytes(hashlib.sha256(step.encode()).digest()[:8], "little")
        rng = np.random.default_rng([self.c.sampling_key, self.round, self.cid, tag])
        sampled = [i for i, u in zip(self.own, rng.random(len(self.own)), strict=True) if u < self.sample_rate]
        if sampled:
            sums = {n: t.clone() for n, t in sums.items()}
            norm = min(self.c.norm, self.clip_norm)  # a canary is a clipped gradient: its norm is at most C
            for i in sampled:
                name, off = self.c._locate(int(self.c.coords[i]))
                if name == ROWS:  # the client's own row (its one row in the positive-only setting)
                    off %= self.c.row_dim
                if name not in sums:
                    raise RuntimeError(f"canary parameter {name} is not trained by the client")
                sums[name].view(-1)[off] -= float(self.c.signs[i]) * norm  # descent moves θ_j by +s·lr·C/B
        return self.inner.finish(sums, step)
