"""The recording half of the attack taps: a :class:`~secure_fed.engine.callbacks.Callback` that records, during
training, the server's view (:class:`~threat_models.views.ServerTap`) and what the listed attacks ask for through
their specs' ``records`` (:class:`~threat_models.recorder.Recorder`: whole uplinks, the auditor's canaries); both are
saved apart from the server's checkpoint (``server_view.pt``, and each recorder's own file). The registered callback,
which also runs the attacks when ``secure-fed run`` ends, is :class:`threat_models.taps.AttackTaps`; the audit
context (:mod:`threat_models.context`) reads the recording from here, below the audit. It names no attack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from secure_fed.plugin_api.attacks import Callback, attack_specs, load_checkpoint_file
from threat_models.attacks_section import attack_settings, attacks_of
from threat_models.recorder import Recorder
from threat_models.views import ServerTap

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan


def recorders_for(plan: RunPlan, exp) -> dict[str, Recorder]:
    """What each attack of ``attacks.run`` asks to record or insert in a run of ``exp`` (its spec's
    ``records(settings, plan, exp)``)."""
    specs = attack_specs()
    attacks = attacks_of(plan)
    out = {}
    for name in attacks.names():
        spec = specs[name]
        if spec.records is not None and (rec := spec.records(attack_settings(attacks, name), plan, exp)) is not None:
            out[name] = rec
    return out


class AttackRecording(Callback):
    """Records what the attacks need during training: the server's view and what their recorders insert."""

    name = "attack_taps"

    def __init__(self, plan: RunPlan):
        self.plan = plan
        self.tap: ServerTap | None = None
        #: attack name → its recorder (only the attacks that record or insert something)
        self.recorders: dict[str, Recorder] = {}
        self._exp = None

    def on_init(self, exp) -> None:
        first = next(iter(exp.theta))
        self.recorders = recorders_for(exp.plan, exp)  # the run's plan, its auto choices resolved
        # an attack may need whole updates and θ at the captured round's start
        full = any(r.whole_uplinks for r in self.recorders.values())
        self.tap = ServerTap(theta0=exp.theta, parameter=first, full=full)
        self._exp = exp

    def inserted(self) -> dict[str, Any]:
        """Attack name → what it inserted into training (its recorder's secrets), for the attacks that insert."""
        return {n: r.secrets for n, r in self.recorders.items() if r.secrets is not None}

    def wrap_setup_query(self, query):
        return self.tap.wrap_setup_query(query)

    def acts_on_clients(self) -> bool:
        return bool(self.inserted())

    def client_mod(self, fn):
        # a recorder whose reply replaces the client's (outermost) wraps outside the others
        for rec in sorted(self.recorders.values(), key=lambda r: r.outermost):
            if rec.secrets is not None and rec.wraps_clients:
                fn = rec.secrets.client_mod(fn)
        return fn

    def wrap_privatizer(self, cid: int, round_idx: int, privatizer):
        for rec in self.recorders.values():
            if rec.secrets is not None and hasattr(rec.secrets, "wrap_privatizer"):
                privatizer = rec.secrets.wrap_privatizer(cid, round_idx, privatizer)
        return privatizer

    def on_uplink(self, round_idx: int, cid: int, wire: dict[str, Any]) -> None:
        self.tap.on_uplink(round_idx, cid, wire)

    def on_aggregate(self, round_idx: int, cohort: list[int], agg) -> None:
        theta = self._exp.theta if self.tap.full else None  # θ before the server's step: as sent this round
        self.tap.on_aggregate(round_idx, cohort, agg.theta_sum if agg.num_clients else None, theta)

    def state_files(self) -> dict[str, Any]:
        files = {"server_view.pt": self.tap.state_dict()}  # the server's recorded view
        for rec in self.recorders.values():
            if rec.secrets is not None:  # the auditor's secrets
                files[rec.file] = {rec.key: rec.secrets.state_dict()}
        return files

    def load_state_files(self, checkpoint_dir: Path) -> None:
        view = checkpoint_dir / "server_view.pt"
        if view.is_file():
            self.tap.load_state_dict(load_checkpoint_file(view))
        for rec in self.recorders.values():
            if rec.secrets is not None and (checkpoint_dir / rec.file).is_file():
                st = load_checkpoint_file(checkpoint_dir / rec.file)[rec.key]
                rec.secrets = type(rec.secrets).from_state_dict(st)


def recording_of(exp) -> AttackRecording | None:
    """The attack recording of an experiment (its attack taps), if it has one."""
    return next((cb for cb in exp.callbacks if isinstance(cb, AttackRecording)), None)
