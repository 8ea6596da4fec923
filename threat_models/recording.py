"""The recording half of the attack taps: a :class:`~secure_fed.engine.callbacks.Callback` that records, during
training, the server's view (:class:`~threat_models.views.ServerTap`) and inserts the auditor's canaries
(:class:`~threat_models.canaries.DiracCanaries`); both are saved apart from the server's checkpoint
(``server_view.pt``, ``auditor.pt``). The registered callback, which also runs the attacks when
``secure-fed run`` ends, is :class:`threat_models.taps.AttackTaps`; the audit context
(:mod:`threat_models.context`) reads the recording from here, below the audit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from secure_fed.engine.callbacks import Callback
from secure_fed.engine.checkpoints import load_checkpoint_file
from secure_fed.errors import ConfigError
from threat_models.canaries import DiracCanaries
from threat_models.canary_clients import CanaryClients
from threat_models.views import ServerTap


class AttackRecording(Callback):
    """Records what the attacks need during training: the server's view and the auditor's canaries."""

    name = "attack_taps"

    def __init__(self, cfg):
        self.cfg = cfg
        self.tap: ServerTap | None = None
        self.canaries: DiracCanaries | None = None
        self.canary_clients: CanaryClients | None = None
        self._exp = None

    def on_init(self, exp) -> None:
        first = next(iter(exp.theta))
        # gradient inversion needs whole updates and θ at the captured round's start
        self.tap = ServerTap(theta0=exp.theta, parameter=first, full="gradient_inversion" in self.cfg.attacks.names())
        self._exp = exp
        audit = self.cfg.attacks.one_run_audit
        if "one_run_audit" in self.cfg.attacks.names() and audit.canaries > 0:
            dp = "dp" in self.cfg.protocols
            client = self.cfg.privacy.client if dp else None
            local = self.cfg.privacy.local if dp else None
            # under DP-SGD in client training the canaries are instances (gradient canaries of norm C)
            unit = "instance" if local is not None else "client"
            norm = audit.canary_norm or (local.clip_norm if local is not None else client.clip_norm if client else 0.05)
            # the trained tensors: θ's (a fixed encoder's are not), and under DP-SGD in the positive-only setting the
            # owner's class row (each client trains its one row)
            trained = {n for n, p in exp.model.encoder.named_parameters() if p.requires_grad}
            rows = None
            if unit == "instance" and exp.W is not None and self.cfg.partition.name == "positive_only":
                if "keyed_hashing" in self.cfg.protocols:
                    raise ConfigError("one_run_audit under privacy.local with keyed_hashing: row canaries need each "
                                      "client's row in the released W's order; audit without keyed_hashing")  # fmt: skip
                owner_row = [int(c.known_labels[0]) for c in exp.fed.clients]
                rows = (np.asarray(owner_row), exp.W.detach().double().cpu().numpy())
            self.canaries = DiracCanaries(
                m=audit.canaries, norm=norm, num_clients=len(exp.fed.clients),
                theta_shapes={n: tuple(t.shape) for n, t in exp.theta.items() if n in trained}, unit=unit,
                own_rows=rows,
            )  # fmt: skip
        self.canary_clients = canary_clients_for(self.cfg, exp)

    def wrap_setup_query(self, query):
        return self.tap.wrap_setup_query(query)

    def acts_on_clients(self) -> bool:
        return self.canaries is not None or self.canary_clients is not None

    def client_mod(self, fn):
        if self.canaries is not None and self.canaries.unit == "client":
            fn = self.canaries.client_mod(fn)
        if self.canary_clients is not None:  # outermost of the two: a canary client's reply is its canary alone
            fn = self.canary_clients.client_mod(fn)
        return fn

    def wrap_privatizer(self, cid: int, round_idx: int, privatizer):
        return privatizer if self.canaries is None else self.canaries.wrap_privatizer(cid, round_idx, privatizer)

    def on_uplink(self, round_idx: int, cid: int, wire: dict[str, Any]) -> None:
        self.tap.on_uplink(round_idx, cid, wire)

    def on_aggregate(self, round_idx: int, cohort: list[int], agg) -> None:
        theta = self._exp.theta if self.tap.full else None  # θ before the server's step: as sent this round
        self.tap.on_aggregate(round_idx, cohort, agg.theta_sum if agg.num_clients else None, theta)

    def state_files(self) -> dict[str, Any]:
        files = {"server_view.pt": self.tap.state_dict()}  # the server's recorded view
        if self.canaries is not None:
            files["auditor.pt"] = {"canaries": self.canaries.state_dict()}  # the auditor's secrets
        if self.canary_clients is not None:
            files["auditor_canary_clients.pt"] = {"canary_clients": self.canary_clients.state_dict()}
        return files

    def load_state_files(self, checkpoint_dir: Path) -> None:
        view, auditor = checkpoint_dir / "server_view.pt", checkpoint_dir / "auditor.pt"
        if view.is_file():
            self.tap.load_state_dict(load_checkpoint_file(view))
        if self.canaries is not None and auditor.is_file():
            st = load_checkpoint_file(auditor)["canaries"]
            self.canaries = DiracCanaries.from_state_dict(st)
        clients = checkpoint_dir / "auditor_canary_clients.pt"
        if self.canary_clients is not None and clients.is_file():
            self.canary_clients = CanaryClients.from_state_dict(load_checkpoint_file(clients)["canary_clients"])


#: ``canaries: auto``: this many canary clients, or a quarter of the run's clients when that is fewer
AUTO_CANARY_CLIENTS = 20


def canary_clients_for(cfg, exp) -> CanaryClients | None:
    """The canary clients of ``canary_client_audit`` (client-level DP's audit: none under DP-SGD in client training,
    whose unit is the instance), in θ's trained tensors, of norm ``canary_norm`` or else privacy.client.clip_norm."""
    opts = cfg.attacks.canary_client_audit
    if "canary_client_audit" not in cfg.attacks.names() or opts.canaries == 0:
        return None
    num_clients = len(exp.fed.clients)
    count = min(AUTO_CANARY_CLIENTS, num_clients // 4) if opts.canaries == "auto" else opts.canaries
    if count == 0:
        return None  # too few clients for auto: the audit reports it skipped (no canary clients were inserted)
    dp = "dp" in cfg.protocols
    if dp and cfg.privacy.local is not None:
        return None
    client = cfg.privacy.client if dp else None
    norm = opts.canary_norm or (client.clip_norm if client is not None else 0.05)
    trained = {n for n, p in exp.model.encoder.named_parameters() if p.requires_grad}
    if count > num_clients:
        raise ConfigError(f"attacks.canary_client_audit.canaries = {count}: at most the run's {num_clients} clients")
    return CanaryClients(c=count, held_out=opts.held_out, norm=norm, num_clients=num_clients,
                         theta_shapes={n: tuple(t.shape) for n, t in exp.theta.items() if n in trained})  # fmt: skip


def recording_of(exp) -> AttackRecording | None:
    """The attack recording of an experiment (its attack taps), if it has one."""
    return next((cb for cb in exp.callbacks if isinstance(cb, AttackRecording)), None)
