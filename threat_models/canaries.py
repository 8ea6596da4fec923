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

The coordinates, signs, owners and bits are the auditor's secret: drawn from the
operating system's entropy (never the run's public seed) and kept in
``RUN_DIR/checkpoints/auditor.pt``.

The score of canary i after training is ``s_i · (θ_T − θ_0)[j_i]``. The auditor
keeps the coordinates, signs and bits on its own side (``RUN_DIR/auditor.pt``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from secure_fed.algorithms.base import ClientFn


class DiracCanaries:
    """``m`` canaries in the flattened θ (parameters in their named order)."""

    def __init__(
        self, *, m: int, norm: float, theta_shapes: dict[str, tuple[int, ...]], num_clients: int, seed: int | None = None
    ):
        """``seed`` None (the default) draws fresh OS entropy; an integer is for tests only."""
        self.m, self.norm = int(m), float(norm)
        self.names = list(theta_shapes)
        sizes = [int(np.prod(s)) for s in theta_shapes.values()]
        self.offsets = np.cumsum([0, *sizes])
        rng = np.random.default_rng(np.random.SeedSequence() if seed is None else [seed, 0xCA7A])
        self.coords = rng.choice(int(self.offsets[-1]), size=self.m, replace=False)
        self.signs = rng.choice(np.array([-1.0, 1.0]), size=self.m)
        self.included = rng.random(self.m) < 0.5
        self.owner = rng.integers(num_clients, size=self.m)

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
            delta = {n: t.clone() for n, t in reply["theta_delta"].items()}
            for i in own:
                name, off = self._locate(int(self.coords[i]))
                delta[name].view(-1)[off] += float(self.signs[i]) * self.norm
            return {**reply, "theta_delta": delta}

        return with_canaries

    def scores(self, theta: dict[str, torch.Tensor], theta0: dict[str, torch.Tensor]) -> np.ndarray:
        """``s_i · (θ − θ⁰)[j_i]`` for every canary (inserted or not)."""
        flat = torch.cat([(theta[n].detach().double().cpu() - theta0[n].detach().double().cpu()).reshape(-1) for n in self.names])
        return self.signs * flat[torch.as_tensor(self.coords)].numpy()

    def state_dict(self) -> dict[str, Any]:
        return {
            "m": self.m, "norm": self.norm, "names": self.names, "offsets": self.offsets, "coords": self.coords,
            "signs": self.signs, "included": self.included, "owner": self.owner,
        }  # fmt: skip

    @classmethod
    def from_state_dict(cls, st: dict[str, Any]) -> DiracCanaries:
        c = cls.__new__(cls)
        for k, v in st.items():
            setattr(c, k, v)
        return c
