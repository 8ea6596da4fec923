"""What the released model's ε (the observer's: who sees θ, W and the files) depends on: every step that shapes a
released tensor must carry a DP mechanism. One list of the steps that do not, from public settings alone, read by
the layer's privacy report and by ``validate``'s plan, so the two cannot disagree. Torch-free."""

from __future__ import annotations

from typing import Any

#: the W-shaping step of an algorithm that collects label sets (FedALC's server W update), without privacy.instance
LABEL_SET_STEP = {"step": "label_set_collection", "released": ["W"],
                  "why": "W's label-set step is un-noised (the server's W update reads the clients' label sets in the "
                         "clear; privacy.instance covers it)"}  # fmt: skip
#: client training (θ and the class rows) without privacy.local or privacy.client
CLIENT_TRAINING_STEP = {"step": "client_training", "released": ["theta", "W"],
                        "why": "client training is un-noised (θ and the class rows are trained without DP-SGD or "
                               "client-level noise; privacy.local or privacy.client covers it)"}  # fmt: skip
#: short names of the steps, for the console's one-sentence ∞ line
SHORT = {"label_set_collection": "W's label-set step", "client_training": "client training"}


def unnoised_steps(
    *, collects_label_sets: bool, label_set_step_noised: bool, client_training_noised: bool
) -> list[dict[str, Any]]:
    """The steps that shape a released tensor with no DP mechanism on them (``{"step", "released", "why"}`` each);
    empty when the released θ and W are covered by the run's units."""
    out = []
    if collects_label_sets and not label_set_step_noised:
        out.append(dict(LABEL_SET_STEP))
    if not client_training_noised:
        out.append(dict(CLIENT_TRAINING_STEP))
    return out
