"""The layer as secure-fed sees it before a run (registered as ``secure_fed.layers``: ``clipping``). Light: no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from clipping_layer.config import ClippingSection
from secure_fed.plugin_api.layers import LayerSpec, layer_specs

if TYPE_CHECKING:
    from secure_fed.plugin_api.layers import RunPlan


def clipping_settings(plan: RunPlan) -> ClippingSection:
    """The layer's settings: its own section of the run's plan, nothing else."""
    return plan.part(ClippingSection)


def describe(plan: RunPlan, num_clients: int) -> list[str]:
    """What ``secure-fed validate`` says of the layer."""
    return [f"clipping: every client update clipped to L2 norm {plan.part(ClippingSection).max_norm:g}"]


def validate(plan: RunPlan, stack: list[str]) -> None:
    """Innermost first: the clip acts on the client's raw update, so it is listed before any layer that sums the
    updates another way (secure sums) or accounts privacy over them (dp), as the engine runs it."""
    if "clipping" not in stack:
        return
    specs = layer_specs()
    for name in stack[: stack.index("clipping")]:
        spec = specs[name]
        if spec.replaces_aggregation or spec.target_epsilons is not None:
            raise ValueError(f"'clipping' must come before '{name}' in protocols: clients clip their raw update first")


CLIPPING = LayerSpec(
    name="clipping",
    threat_model=(
        "bounds each client's update to L2 norm clipping.max_norm on the client (limits one honest client's influence "
        "on a round); no privacy by itself: it adds no noise, gives no DP guarantee, and the server does not check it"
    ),
    implementation="clipping_layer.layer:Clipping",
    validate=validate,
    settings=clipping_settings,
    describe=describe,
)
