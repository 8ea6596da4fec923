"""Canary clients for the one-shot privacy estimate (Andrew, Kairouz, Oh, Oprea, McMahan & Suriyakumar, ICLR 2024).

``c`` of the run's clients are made canary clients: whenever such a client is sampled (like any client: it is one of
the population, so the sampling rate and the accountant are the run's own), its update is replaced by its canary, a
fixed random unit direction ``u_i`` on the sphere of θ's trained parameters, scaled to ``norm`` (the clip norm). The
replacement is innermost (:meth:`CanaryClients.client_mod`, the hook the Dirac canaries of
:mod:`threat_models.canaries` use): the canary then goes through the run's own client-level DP clip, noise and
aggregation; nothing is simulated. ``held_out`` further directions are drawn the same way and never inserted: their
cosines with the final model delta are the null (≈ N(0, 1/d) in dimension d).

The directions, the canary clients and the held-out directions are the auditor's secret: drawn from the operating
system's entropy (never the run's public seed; an integer seed is for tests only) and kept in
``RUN_DIR/private/checkpoints/auditor.pt``. A direction is regenerated from its seed, so the state is small.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from secure_fed.plugin_api.attacks import ClientFn, dense_delta


class CanaryClients:
    """``c`` inserted canary clients and ``held_out`` directions never inserted, in θ's trained parameters."""

    def __init__(
        self,
        *,
        c: int,
        held_out: int,
        norm: float,
        theta_shapes: dict[str, tuple[int, ...]],
        num_clients: int,
        seed: int | None = None,
    ):
        if not 1 <= c <= num_clients:
            raise ValueError(f"{c} canary clients: between 1 and the run's {num_clients} clients")
        self.c, self.held_out, self.norm = int(c), int(held_out), float(norm)
        self.shapes = {n: tuple(s) for n, s in theta_shapes.items()}
        rng = np.random.default_rng(np.random.SeedSequence() if seed is None else [seed, 0xC11E])
        #: the canary clients (inserted canary i is client ``clients[i]``'s update whenever it is sampled)
        self.clients = np.sort(rng.choice(num_clients, size=self.c, replace=False))
        #: one seed per direction: inserted first (c), then held out
        self.seeds = rng.integers(2**63, size=self.c + self.held_out)

    @property
    def dim(self) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes.values()))

    def direction(self, i: int) -> np.ndarray:
        """Direction i (float64, unit L2 norm in the flattened trained parameters, in their named order)."""
        z = np.random.default_rng(int(self.seeds[i])).standard_normal(self.dim)
        return z / np.linalg.norm(z)

    def canary_update(self, i: int, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inserted canary i as a Δθ: ``norm · u_i`` on the trained parameters, zero on the others of ``like``."""
        flat, out, at = self.direction(i) * self.norm, {}, 0
        for name, t in like.items():
            t = dense_delta(t)
            if name in self.shapes:
                n = t.numel()
                out[name] = torch.as_tensor(flat[at : at + n], dtype=t.dtype, device=t.device).reshape(t.shape)
                at += n
            else:
                out[name] = torch.zeros_like(t)
        return out

    def client_mod(self, fn: ClientFn) -> ClientFn:
        """A canary client's reply carries its canary in place of its own update (innermost: before any protocol
        layer, so client-level DP clips and noises it like any update); other clients are untouched."""
        index = {int(cid): i for i, cid in enumerate(self.clients)}

        def with_canary(payload, data):
            reply = fn(payload, data)
            i = index.get(int(data.client_id))
            if i is None:
                return reply
            out = {**reply, "theta_delta": self.canary_update(i, reply["theta_delta"])}
            if "rows_delta" in reply:  # the canary is a direction in θ alone
                out["rows_delta"] = torch.zeros_like(dense_delta(reply["rows_delta"]))
            return out

        return with_canary

    def cosines(self, theta: dict[str, torch.Tensor], theta0: dict[str, torch.Tensor]) -> np.ndarray:
        """cos(θ − θ⁰, u_i) for every direction (inserted first, then held out) over the trained parameters."""
        delta = np.concatenate(
            [(theta[n].detach().double().cpu() - theta0[n].detach().double().cpu()).reshape(-1).numpy() for n in self.shapes]
        )
        norm = float(np.linalg.norm(delta))
        if norm == 0.0:
            return np.zeros(self.c + self.held_out)
        return np.array([float(self.direction(i) @ delta) for i in range(self.c + self.held_out)]) / norm

    def state_dict(self) -> dict[str, Any]:
        return {"c": self.c, "held_out": self.held_out, "norm": self.norm, "shapes": self.shapes, "clients": self.clients,
                "seeds": self.seeds}  # fmt: skip

    @classmethod
    def from_state_dict(cls, st: dict[str, Any]) -> CanaryClients:
        c = cls.__new__(cls)
        for k, v in st.items():
            setattr(c, k, v)
        return c
