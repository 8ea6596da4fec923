"""The instance unit's W step (server side): DP-SGD over the clients' label sets in place of the algorithm's own W
step, its label sets Poisson-sampled and its sum noised from the server's secret stream, each step charged to the
ledger (:mod:`protocols.dp.label_set_dpsgd`, :mod:`protocols.dp.discrete_gaussian`)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from protocols.dp.discrete_gaussian import noisy_sum
from protocols.dp.label_set_dpsgd import dp_label_set_step
from protocols.dp.run_graph import SERVER_STEP
from secure_fed.plugin_api.layers import Algorithm


def private_w_step(layer, algorithm: Algorithm) -> Callable[[torch.Tensor], dict[str, float] | None]:
    """The W step the dp ``layer`` puts in place of ``algorithm``'s (its declared ``w_step``): the same label sets,
    the sum clipped and noised, divided by the public B̄. Past the instance unit's budget it takes no step (None) and
    records why in ``layer.pretrain_stopped`` where W stays fixed from then on (fedalc_fixed)."""
    unit = layer.units["instance"]
    fixed = layer.settings.algorithm.capabilities.fixed_w
    mech = unit.mechanism(SERVER_STEP)
    divisor = layer.settings.instance_divisor  # public B̄ (config), never the realised count

    def dp_step(W: torch.Tensor) -> dict[str, float] | None:
        if (why := unit.stop_reason(1, SERVER_STEP)) is not None:
            # fedalc_fixed: W stays fixed from here. fedalc: unreachable in practice, since budget_stop refuses the
            # round first (same ledger, same check); if reached, the W step is skipped, the clients' update stands
            layer.pretrain_stopped = why if fixed else None
            return None
        label = f"instance step {mech.steps}"  # the ledger's step count: a resumed run redraws the same
        stream = layer.server_stream  # read at each step: a resumed run restores it
        n_all = algorithm.label_sets.shape[0]
        pick = torch.from_numpy(stream.uniform(n_all, f"{label} sample") < mech.sample_rate)
        stats = dp_label_set_step(
            W, algorithm.label_sets, algorithm.per_set_gradients, clip_norm=mech.clip_norm,
            noise_multiplier=mech.sigma, divisor=divisor, step_size=algorithm.step_size, pick=pick,
            noise=lambda total, sigma, sens: noisy_sum(
                total, sigma=sigma, sensitivity=sens, stream=stream, label=f"{label} noise"),
        )  # fmt: skip
        unit.step(1, SERVER_STEP)
        return {"reg": algorithm.regularizer_value(W), **stats} if fixed else stats

    return dp_step


__all__ = ["private_w_step"]
