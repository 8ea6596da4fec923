"""The attack taps: the :class:`~secure_fed.engine.callbacks.Callback` that instruments a training run.

Registered under the ``secure_fed.callbacks`` entry points; active when ``attacks.run`` names an
attack. During training it records the server's view and inserts the auditor's canaries
(:class:`~threat_models.recording.AttackRecording`). When ``secure-fed run`` ends, it runs the
configured attacks and writes ``private/attacks.json`` (operator-only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from secure_fed.plugin_api.attacks import attacks_path, trained
from threat_models.attacks_section import attacks_of
from threat_models.recording import AttackRecording

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan


class AttackTaps(AttackRecording):
    """The recording, and the attacks when ``secure-fed run`` ends."""

    def on_cli_run_end(self, exp, result) -> None:
        if not trained(result.summary["status"]):
            return
        # imported here: the audit (attacks, plots) loads only when a run ends, not with every run's callbacks
        from threat_models.audit import audit
        from threat_models.context import AuditContext

        print(f"attacks ({', '.join(attacks_of(self.plan).names())}):")
        audit(AuditContext(exp))
        print(f"  wrote {attacks_path(exp.run_dir)} (operator-only)")


def make_attack_taps(plan: RunPlan) -> AttackTaps | None:
    """The ``secure_fed.callbacks`` factory: taps only when the plan's ``attacks.run`` lists attacks."""
    return AttackTaps(plan) if attacks_of(plan).names() else None
