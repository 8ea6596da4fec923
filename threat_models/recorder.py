"""What one attack asks the training run to record or insert: its spec's ``records`` returns a :class:`Recorder`.

Light (the standard library only): an attack's spec module builds one without importing torch. The recording
callback (:class:`threat_models.recording.AttackRecording`) asks every listed attack's spec for its recorder when a
run starts and never names an attack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Recorder:
    """One attack's needs during training.

    Attributes:
        whole_uplinks: the server's tap keeps each client's whole uplink and θ as sent in its captured round (not only
            the first θ parameter's update).
        secrets: what the auditor inserts into training and keeps (e.g. canaries): an object with ``client_mod(fn)``
            (when ``wraps_clients``), optionally ``wrap_privatizer(cid, round_idx, privatizer)``, ``state_dict()`` and
            the class method ``from_state_dict(state)``. The audit hands it back to the attack
            (:meth:`threat_models.context.AuditContext.inserted`); None: nothing inserted.
        file: the file in the run's checkpoint directory its state is saved in (operator-only).
        key: the key of the state in that file.
        wraps_clients: ``secrets.client_mod`` wraps the clients' function.
        outermost: its ``client_mod`` replaces a client's reply whole, so it wraps outside the other attacks'.
    """

    whole_uplinks: bool = False
    secrets: Any = None
    file: str | None = None
    key: str = "state"
    wraps_clients: bool = True
    outermost: bool = False

    def __post_init__(self):
        if self.secrets is not None and not self.file:
            raise ValueError("a recorder that inserts secrets names the file its state is saved in")
