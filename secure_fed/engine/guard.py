"""Enforcement of who may see what, on every message.

:class:`MessageGuard` checks each server→client payload and each
client→server reply against the positive-label setting's rules:

* a client receives θ (exactly the encoder's parameters) and the rows of W
  for the labels it knows, and nothing else about W;
* the server receives θ deltas, deltas of the client's own rows, tokens and a
  label, counts and a loss — never features and never another client's row.

A violation raises :class:`~secure_fed.errors.PrivacyViolation` before the
message is delivered. With ``log`` set, every delivered message is recorded so
tests and audits can inspect exactly what each party saw.
"""

from __future__ import annotations

from typing import Any

import torch

from secure_fed.errors import PrivacyViolation

MAX_TOKEN_BYTES = 64


class MessageGuard:
    def __init__(
        self,
        *,
        theta_shapes: dict[str, tuple[int, ...]],
        embedding_dim: int,
        allowed_rows: dict[int, set[int]],
        down_keys: set[str],
        up_keys: set[str],
        log: list[dict[str, Any]] | None = None,
    ):
        """``down_keys``/``up_keys``: every message key the run may carry, as the algorithm and the protocol
        layers declare them (``Algorithm.downlink_keys``, ``LayerSpec.downlink_keys``, …); anything else is refused."""
        self.theta_shapes = theta_shapes
        self.d = embedding_dim
        self.allowed_rows = allowed_rows
        self.down_keys, self.up_keys = set(down_keys), set(up_keys)
        self.log = log

    def _fail(self, direction: str, cid: int, why: str) -> None:
        raise PrivacyViolation(f"{direction} message for client {cid}: {why}")

    def _check_theta(self, direction: str, cid: int, theta: Any) -> None:
        if not isinstance(theta, dict) or set(theta) != set(self.theta_shapes):
            self._fail(direction, cid, "θ must hold exactly the encoder's parameters")
        for k, v in theta.items():
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != self.theta_shapes[k]:
                self._fail(direction, cid, f"θ entry '{k}' has the wrong shape")

    def _check_rows(self, direction: str, cid: int, msg: dict, key: str) -> None:
        ids = msg.get("row_ids")
        rows = msg.get(key)
        if ids is None or rows is None:
            self._fail(direction, cid, f"'{key}' needs 'row_ids'")
        ids_list = [int(i) for i in torch.as_tensor(ids).reshape(-1)]
        extra = set(ids_list) - self.allowed_rows.get(cid, set())
        if extra:
            self._fail(direction, cid, f"class rows {sorted(extra)[:5]} do not belong to this client")
        if not isinstance(rows, torch.Tensor) or tuple(rows.shape) != (len(ids_list), self.d):
            self._fail(direction, cid, f"'{key}' must have shape ({len(ids_list)}, {self.d})")

    def check_down(self, cid: int, payload: dict[str, Any]) -> None:
        extra = set(payload) - self.down_keys
        if extra:
            self._fail("downlink", cid, f"keys {sorted(extra)} are not allowed")
        if "theta" in payload:
            self._check_theta("downlink", cid, payload["theta"])
        if "rows" in payload or "row_ids" in payload:
            self._check_rows("downlink", cid, payload, "rows")
        for k in ("train_rows", "loss", "tokenizer"):
            if k in payload and not isinstance(payload[k], (bool, str)):
                self._fail("downlink", cid, f"'{k}' must be a flag or a name")
        if self.log is not None:
            self.log.append({"direction": "down", "client": cid, "message": payload})

    def record(self, direction: str, cid: int, message: dict[str, Any]) -> None:
        """Log a message as the server sees it (e.g. a masked or encrypted update)."""
        if self.log is not None:
            self.log.append({"direction": direction, "client": cid, "message": message})

    def check_up(self, cid: int, reply: dict[str, Any], *, record: bool = True) -> None:
        extra = set(reply) - self.up_keys
        if extra:
            self._fail("uplink", cid, f"keys {sorted(extra)} are not allowed")
        if "theta_delta" in reply:
            self._check_theta("uplink", cid, reply["theta_delta"])
        if "rows_delta" in reply:
            self._check_rows("uplink", cid, reply, "rows_delta")
        if "tokens" in reply:
            toks = reply["tokens"]
            if not isinstance(toks, list) or any(not isinstance(t, bytes) or len(t) > MAX_TOKEN_BYTES for t in toks):
                self._fail("uplink", cid, f"tokens must be a list of byte strings of ≤ {MAX_TOKEN_BYTES} bytes")
        if "pseudonym" in reply and (not isinstance(reply["pseudonym"], bytes) or len(reply["pseudonym"]) > MAX_TOKEN_BYTES):
            self._fail("uplink", cid, "a pseudonym must be a short byte string")
        if "label" in reply and reply["label"] not in self.allowed_rows.get(cid, set()):
            self._fail("uplink", cid, "a client may only report its own label")
        for k in ("num_examples", "loss"):
            if k in reply and not isinstance(reply[k], (int, float)):
                self._fail("uplink", cid, f"'{k}' must be a number")
        if record:
            self.record("up", cid, reply)
