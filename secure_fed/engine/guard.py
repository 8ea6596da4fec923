"""Enforcement of who may see what, on every message.

:class:`MessageGuard` checks each server→client payload and each client→server reply against the rules
that the algorithm and the run's protocol layers declare for their keys
(:mod:`secure_fed.messages`), and against what the algorithm lets each client see of the server's
named tensors (:class:`~secure_fed.messages.Visibility`). In the positive-only setting that means:

* a client receives θ (exactly the encoder's parameters) and the rows of W for the labels it knows, and
  nothing else about W;
* the server receives θ deltas, deltas of the client's own rows, tokens and a label, counts and a loss —
  never features and never another client's row.

The guard knows no key by name: a key nobody declared is refused, and a declared key is checked by its
rule. A violation raises :class:`~secure_fed.errors.PrivacyViolation` before the message is delivered.
With ``log`` set, every delivered message is recorded so tests and audits can inspect exactly what each
party saw.
"""

from __future__ import annotations

from typing import Any

from secure_fed.errors import PrivacyViolation
from secure_fed.messages import CheckContext, Rules, Visibility


class MessageGuard:
    def __init__(
        self,
        *,
        shapes: dict[str, Any],
        visibility: dict[str, Visibility],
        client_rows: dict[int, set[int]],
        down_rules: Rules,
        up_rules: Rules,
        log: list[dict[str, Any]] | None = None,
    ):
        """
        Args:
            shapes: each named server tensor's shape (a dict of shapes for a parameter group such as θ).
            visibility: what the algorithm lets a client see of each named server tensor.
            client_rows: each client's own rows of the row table (the rows of the labels it holds).
            down_rules, up_rules: every key the run's messages may carry, with its rule, as the algorithm
                and the listed protocol layers declare them; anything else is refused.
        """
        self.shapes = shapes
        self.visibility = {k: Visibility(v) for k, v in visibility.items()}
        self.client_rows = {cid: frozenset(rows) for cid, rows in client_rows.items()}
        self.down_rules, self.up_rules = dict(down_rules), dict(up_rules)
        self.log = log

    def set_client_rows(self, client_rows: dict[int, set[int]]) -> None:
        """Each client's rows after the row order changed (keyed label pseudonyms)."""
        self.client_rows = {cid: frozenset(rows) for cid, rows in client_rows.items()}

    def _check(self, direction: str, cid: int, msg: dict[str, Any], rules: Rules) -> None:
        extra = set(msg) - set(rules)
        if extra:
            raise PrivacyViolation(f"{direction} message for client {cid}: keys {sorted(extra)} are not allowed")
        ctx = CheckContext(self.shapes, self.visibility, self.client_rows.get(cid, frozenset()))
        for key, value in msg.items():
            if (why := rules[key].check(key, value, msg, ctx)) is not None:
                raise PrivacyViolation(f"{direction} message for client {cid}: {why}")

    def check_down(self, cid: int, payload: dict[str, Any], *, plan: list[dict] | tuple = ()) -> None:
        """Check a payload before it leaves the server; the log records it with the round's client plan (the
        steps a remote client is asked to run, public values only), when there is one."""
        self._check("downlink", cid, payload, self.down_rules)
        if self.log is not None:
            entry = {"direction": "down", "client": cid, "message": payload}
            self.log.append({**entry, "plan": list(plan)} if plan else entry)

    def record(self, direction: str, cid: int, message: dict[str, Any]) -> None:
        """Log a message as the server sees it (e.g. a masked or encrypted update)."""
        if self.log is not None:
            self.log.append({"direction": direction, "client": cid, "message": message})

    def check_up(self, cid: int, reply: dict[str, Any], *, record: bool = True) -> None:
        self._check("uplink", cid, reply, self.up_rules)
        if record:
            self.record("up", cid, reply)
