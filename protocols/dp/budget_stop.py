"""The dp layer's budget stop: a round is not started when one of its units' planned steps would pass its target."""

from __future__ import annotations

from protocols.dp.accountant import PrivacyUnit
from protocols.dp.privacy_units import client_training_steps
from protocols.dp.run_graph import CLIENT_STEP, SERVER_STEP
from protocols.layer_settings import DPSettings
from secure_fed.plugin_api.layers import StackEnv


def budget_stop(units: dict[str, PrivacyUnit], settings: DPSettings, env: StackEnv) -> str | None:
    """A reason not to start the next round: the client unit's round, or the instance unit's steps of a round (its
    DP-SGD steps, and a W step where one runs every round), would exceed the unit's target; None to go on."""
    if (client := units.get("client")) is not None and (why := client.stop_reason()):
        return why
    inst = units.get("instance")
    if inst is None:
        return None
    plan = {}
    if CLIENT_STEP in inst.mechanisms:
        plan[CLIENT_STEP] = client_training_steps(settings, env)
    if SERVER_STEP in inst.mechanisms and not settings.algorithm.capabilities.fixed_w:  # a W step every round
        plan[SERVER_STEP] = 1
    return inst.stop_reason(plan=plan) if plan else None


__all__ = ["budget_stop"]
