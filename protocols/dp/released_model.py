"""What the released model's ε (the observer's: who sees θ, W and the files) depends on: every channel by which
training data reaches a released tensor must carry a DP mechanism. Which channels a run leaves without one is the
privacy-loss graph's rule (:func:`protocols.dp.privacy_graph.uncovered_channels`), applied to the layer's units by
its privacy report and to the config's declared mechanisms by ``validate``'s plan
(:func:`protocols.dp.run_graph.planned_unnoised_steps`), so the two cannot disagree; this module names each such
channel as a step of the run."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from protocols.dp.mechanisms import CLIENT_TRAINING, LABEL_SETS

#: the W-shaping step of an algorithm that collects label sets (FedALC's server W update), without privacy.instance
LABEL_SET_STEP = {"step": "label_set_collection", "released": ["W"],
                  "why": "W's label-set step is un-noised (the server's W update reads the clients' label sets in the "
                         "clear; privacy.instance covers it)"}  # fmt: skip
#: client training (θ and the class rows) without privacy.local or privacy.client
CLIENT_TRAINING_STEP = {"step": "client_training", "released": ["theta", "W"],
                        "why": "client training is un-noised (θ and the class rows are trained without DP-SGD or "
                               "client-level noise; privacy.local or privacy.client covers it)"}  # fmt: skip
#: each channel's step
STEPS = {LABEL_SETS: LABEL_SET_STEP, CLIENT_TRAINING: CLIENT_TRAINING_STEP}


def unnoised_steps(uncovered: Iterable[str]) -> list[dict[str, Any]]:
    """The steps that shape a released tensor with no DP mechanism on them (``{"step", "released", "why"}`` each), one
    per ``uncovered`` channel; empty when the released θ and W are covered by the run's units. A statistic's channel
    (``statistic:<key>``, :mod:`protocols.dp.mechanism_plugins`) is a step of its own."""
    return [dict(STEPS[c]) if c in STEPS else statistic_step(c) for c in uncovered]


def statistic_step(channel: str) -> dict[str, Any]:
    """The step of a statistic released before round 0 with no mechanism on it (``statistic:<key>``)."""
    stat = channel.split(":", 1)[1]
    return {"step": f"statistic_{stat}", "released": ["theta", "W"],
            "why": f"the {stat} the algorithm reads from the clients before round 0 are un-noised (the DP mechanism "
                   "plugin that releases them, e.g. privacy.label_prior, covers them)"}  # fmt: skip


__all__ = ["CLIENT_TRAINING_STEP", "LABEL_SET_STEP", "STEPS", "unnoised_steps"]
