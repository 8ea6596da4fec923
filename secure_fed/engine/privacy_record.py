"""The privacy record: the ledger's (ε, δ) so far on every metrics line (ε = ∞ without DP)."""

from __future__ import annotations

from secure_fed.engine.callbacks import Callback
from secure_fed.engine.privacy_report import privacy_now, tagged_report
from secure_fed.run_files import PRIVACY_RECORD


class PrivacyRecord(Callback):
    """Adds ``privacy`` (:func:`~secure_fed.engine.privacy_report.privacy_now`, tagged) to each round's record."""

    name = "privacy_record"

    def on_record(self, ctx, record, diagnostics) -> None:
        units = ctx.stack.accounting()
        record[PRIVACY_RECORD] = tagged_report(privacy_now(units), units)
