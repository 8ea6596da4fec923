"""What each attacker role sees, recorded by the simulator.

:class:`ServerTap` runs inside the engine and writes down what the server
receives: the label-set collection replies (tokens with a label index, or with
the row a pseudonym maps to) and, for one captured round, each client's uplink
*as it crosses the wire* together with the sum the server learns. Under secure
aggregation or CKKS the wire carries masked or encrypted vectors, so the view's
``individual`` is ``None``; under keyed hashing the tokens are HMACs and
``row_names`` is ``None``.

The views are frozen dataclasses; an attack receives exactly one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import scipy.sparse as sp
import torch

from secure_fed.plugin_api.attacks import dense_delta


@dataclass(frozen=True)
class RoundCapture:
    """One round's uplinks (the last round with participants) restricted to one θ parameter (the first layer)."""

    round: int
    cohort: tuple[int, ...]
    parameter: str
    uplink_kind: str  #: "plaintext", "masked" (secure aggregation) or "encrypted" (CKKS)
    individual: dict[int, torch.Tensor] | None  #: per-client Δ of ``parameter`` as sent; None unless plaintext
    aggregate: torch.Tensor  #: Σ over the cohort of Δ of ``parameter``, as the server obtains it
    #: with a full capture (an attack that needs whole updates, e.g. gradient inversion): θ as the server sent it this
    #: round, each client's Δθ of every parameter as sent (None unless plaintext) and the sum of every parameter
    theta_start: dict[str, torch.Tensor] | None = None
    updates: dict[int, dict[str, torch.Tensor]] | None = None
    aggregate_update: dict[str, torch.Tensor] | None = None


@dataclass(frozen=True)
class ServerView:
    """The honest-but-curious server: everything it received or computed, nothing the clients kept."""

    config: str  #: the run's configuration, as its YAML (the plan's ``config_yaml``)
    tokenizer: str | None  #: the tokenizer it asked for ("sha256", or "hmac-sha256" under keyed hashing)
    token_messages: tuple[tuple[int, tuple[bytes, ...], int], ...]  #: (client, tokens, W row) per reply
    label_sets: sp.csr_matrix | None  #: merged label sets (CSR), columns in the server's row order
    row_names: tuple[str, ...] | None  #: label name of each W row, if labels arrived in the clear
    label_vocabulary: tuple[str, ...]  #: the dataset's public label list (order of W rows unknown if pseudonymised)
    theta0: dict[str, torch.Tensor]
    theta: dict[str, torch.Tensor]
    W: torch.Tensor | None  #: rows in the server's order (None: the model family has no row table)
    capture: RoundCapture | None
    privacy: dict[str, Any]


@dataclass(frozen=True)
class ObserverView:
    """Anyone holding the released model: θ, W with its label names, the public configuration."""

    config: str  #: the run's configuration, as its YAML (the plan's ``config_yaml``)
    theta0: dict[str, torch.Tensor]
    theta: dict[str, torch.Tensor]
    W: torch.Tensor | None  #: rows in label-name order (a released model must map rows to names); None without rows
    label_names: tuple[str, ...]
    privacy: dict[str, Any]


@dataclass(frozen=True)
class ClientView:
    """A (possibly malicious) client: its own data and what the server sent it."""

    client_id: int
    raw: Any  #: its own feature rows (CSR)
    labels: tuple[int, ...]  #: the labels it holds
    theta: dict[str, torch.Tensor]  #: the last θ it received
    rows: torch.Tensor  #: its own class-embedding row(s), as last received


class ServerTap:
    """Engine-side recorder of the server's view (created when ``attacks.run`` is set)."""

    def __init__(self, *, theta0: dict[str, torch.Tensor], parameter: str, full: bool = False):
        self.theta0 = {n: t.detach().cpu().clone() for n, t in theta0.items()}
        self.parameter = parameter
        self.full = full  #: also record θ at the round's start and whole updates (every parameter)
        self.token_messages: list[tuple[int, tuple[bytes, ...], int]] = []
        self._wire: dict[int, Any] = {}
        self.capture: dict[str, Any] | None = None

    def wrap_setup_query(self, query):
        """Records the label-set replies the server's algorithm receives (after server-side pseudonym lookup)."""

        def q(payload_fn, client_fn):
            replies = query(payload_fn, client_fn)
            for cid, r in replies:
                if "tokens" in r:
                    self.token_messages.append((int(cid), tuple(r["tokens"]), int(r["label"])))
            return replies

        return q

    def on_uplink(self, round_idx: int, cid: int, wire: dict[str, Any]) -> None:
        self._wire[int(cid)] = wire

    def on_aggregate(
        self, round_idx: int, cohort: list[int], theta_sum: dict[str, torch.Tensor] | None,
        theta: dict[str, torch.Tensor] | None = None,
    ) -> None:  # fmt: skip
        """Keeps the latest round with at least one participant (a budget stop may end a run early); ``theta``: θ as
        the server sent it this round (kept with a full capture)."""
        wires = self._wire
        if theta_sum is None:
            self._wire = {}
            return
        plain = bool(wires) and all(isinstance(w.get("theta_delta"), dict) for w in wires.values())
        kind = "plaintext" if plain else ("encrypted" if any("ciphertexts" in w for w in wires.values()) else "masked")
        indiv = (
            {cid: dense_delta(w["theta_delta"][self.parameter]).detach().cpu().clone() for cid, w in wires.items()}
            if plain else None
        )  # fmt: skip
        agg = theta_sum[self.parameter].detach().cpu().clone() if theta_sum is not None else None
        self.capture = {
            "round": round_idx, "cohort": tuple(int(c) for c in cohort), "parameter": self.parameter,
            "uplink_kind": kind, "individual": indiv, "aggregate": agg,
        }  # fmt: skip
        if self.full:
            cpu = lambda d: {n: dense_delta(t).detach().cpu().clone() for n, t in d.items()}  # noqa: E731
            self.capture["theta_start"] = None if theta is None else cpu(theta)
            self.capture["updates"] = {cid: cpu(w["theta_delta"]) for cid, w in wires.items()} if plain else None
            self.capture["aggregate_update"] = cpu(theta_sum)
        self._wire = {}

    def state_dict(self) -> dict[str, Any]:
        return {
            "theta0": self.theta0, "token_messages": self.token_messages,
            "capture": self.capture, "parameter": self.parameter,
        }  # fmt: skip

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.theta0, self.token_messages = st["theta0"], st["token_messages"]
        self.capture, self.parameter = st["capture"], st["parameter"]
