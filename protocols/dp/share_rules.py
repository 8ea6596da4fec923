"""What ``privacy.local.noise: shares`` (distributed DP-FedSGD for the instance unit) needs of a config.

Torch-free: :mod:`protocols.layer_specs` calls :func:`local_shares_error` when ``secure-fed validate`` reads a
config, before any layer is built. Each reason is one line (the caller raises it as the config's error).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from protocols.config_sections import LocalDPConfig
    from secure_fed.plugin_api.layers import TrainingPlan

#: the option's name, as every reason below spells it
OPTION = "privacy.local.noise: shares"


def local_steps(local_epochs: int, sample_rate: float) -> int:
    """DP-SGD steps a client runs per round (:func:`protocols.dp.local_dpsgd.local_steps_per_round`, which imports
    torch): local_epochs × round(1/q), at least one step an epoch."""
    return int(local_epochs) * max(1, round(1.0 / float(sample_rate)))


def local_shares_error(
    loc: LocalDPConfig | None, training: TrainingPlan, *, stack: list[str], with_client_unit: bool, bound: int | None
) -> str | None:
    """Why a config cannot run ``privacy.local.noise: shares``, or None (also None when the option is not set):
    ``loc`` its ``privacy.local`` section, ``training`` its plan's ``training`` part, ``stack`` its protocols,
    ``with_client_unit`` whether ``privacy.client`` is set, ``bound`` the run's ``max_labels_per_instance``.

    The shares add up to the accounted noise only in an exact sum of one noisy gradient sum per client: secure
    aggregation (integer sums; CKKS decrypts approximately), one local step a round (a second step would start from
    the first's lightly-noised model), a plain SGD step the server can apply to the sum, each instance on one client
    (its copies on k clients would enter the one sum with sensitivity kC), and no client-level clip of the noised
    sum (a data-dependent scaling of each client's share)."""
    if loc is None or loc.noise != "shares":
        return None
    t = training
    if "ckks" in stack:
        return (
            f"{OPTION} with ckks: CKKS decrypts approximately, so the sum the key holders return carries data-dependent "
            "approximation error and float decryption noise, not the discrete Gaussian release the ledger accounts; use "
            "secure_aggregation (exact integer sums) or privacy.local.noise: local"
        )
    if "secure_aggregation" not in stack:
        return (
            f"{OPTION} needs secure_aggregation after dp in protocols: each client adds only a 1/√t share of the noise, "
            "so without a secure sum the server would see lightly-noised single gradient sums"
        )
    steps = local_steps(t.local_epochs, loc.batch_sample_rate)
    if steps != 1:
        return (
            f"{OPTION} runs one DP-SGD step per client and round, and training.local_epochs {t.local_epochs} × "
            f"round(1/privacy.local.batch_sample_rate {loc.batch_sample_rate:g}) is {steps} steps: set local_epochs: 1 "
            "and batch_sample_rate above 2/3 (1.0: every example of the client, each kept with probability q)"
        )
    if t.client_optimizer != "sgd" or t.client_momentum != 0.0 or t.weight_decay != 0.0:
        return (
            f"{OPTION}: the server applies the step −client_lr·(summed noisy gradient)/(batch_size · expected clients), "
            f"plain SGD; training.client_optimizer {t.client_optimizer}, client_momentum {t.client_momentum:g}, "
            f"weight_decay {t.weight_decay:g} would not be what runs: use sgd with momentum 0 and weight_decay 0"
        )
    if with_client_unit:
        return (
            f"{OPTION} with privacy.client: the client-level clip would rescale each client's noised sum by a "
            "data-dependent factor, and the shares would no longer add up to the accounted noise; use one of them"
        )
    if bound is not None and bound > 1:
        return (
            f"{OPTION} with privacy.local.max_labels_per_instance {bound}: an instance on up to {bound} clients would "
            f"enter the one noised sum {bound} times (sensitivity {bound}C, not C); set it to 1 or use noise: local"
        )
    return None
