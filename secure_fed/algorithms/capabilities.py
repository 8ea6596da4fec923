"""What an algorithm is, declared once: :class:`AlgorithmCapabilities`.

Validation (:mod:`secure_fed.config.schema`, :mod:`secure_fed.plugin_specs`), the protocol layers and the memory estimate
read these facts instead of testing an algorithm's name. The declaration sits on the algorithm's parameters model
(``AlgorithmParams.capabilities``, :mod:`secure_fed.algorithms.params`), so it is read without importing torch.
This module imports nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: the differential-privacy units (``privacy.instance``, ``privacy.client``, ``privacy.local``)
DP_UNITS = frozenset({"instance", "client", "local"})


@dataclass(frozen=True)
class AlgorithmCapabilities:
    """The facts about an algorithm that the rest of the framework may ask.

    Attributes:
        has_rows: the algorithm's method keeps a per-label row table W (it trains, fixes or regularises rows), so it
            needs a model family with rows (``model.family: embedding``); False: it runs with any family.
        trains_rows: clients train their own class rows and send the delta back (``train_rows`` in the downlink).
        fixed_w: W is fixed once setup is done: neither the clients nor the server train rows in the rounds (a
            private W step, if any, runs at setup: its planned steps are the params' :meth:`private_w_steps`).
        collects_label_sets: setup collects the clients' label sets (instance tokens and labels) for the server.
        private_w_step: the algorithm exposes its W step over the collected label sets (``w_step``, with
            ``per_set_gradients``, ``label_sets`` and ``step_size``), which the ``dp`` layer wraps with DP-SGD over
            label sets (``privacy.instance``).
        sends_weights: its clients report an aggregation weight computed from their own data (uplink ``weight``):
            the server's average is weighted by it, so ``training.aggregation`` must stay uniform.
        dp_units: the DP units (:data:`DP_UNITS`) whose guarantee covers the algorithm's releases.
        centralised: one trainer holds all training data (the upper bounds): no clients, no protocol layers.
        shares_nothing: clients train alone and send nothing (the lower reference): no protocol layers.
        setting: ``positive_only``: its clients must hold one label each (``partition.name: positive_only``);
            ``general``: a baseline of the general multi-label setting (rowless model family, full label vectors);
            ``any``: either.
        requires_family: the model family the algorithm trains (``model.family``), or None for any.
        client_training: its clients train in the rounds (False: its client update reads no data and sends a
            constant, so the rounds release nothing about the clients and no DP mechanism needs to cover them).
        setup_statistics: the statistics (keys) its setup asks the clients for with the payload ``{"statistic":
            key}`` and releases through θ or W; under ``dp`` a DP mechanism plugin that releases the key must cover
            each (:mod:`protocols.dp.mechanism_plugins`), else its channel is un-noised (ε ∞).
    """

    has_rows: bool = False
    trains_rows: bool = True
    fixed_w: bool = False
    collects_label_sets: bool = False
    private_w_step: bool = False
    sends_weights: bool = False
    dp_units: frozenset[str] = frozenset({"client", "local"})
    centralised: bool = False
    shares_nothing: bool = False
    setting: Literal["any", "positive_only", "general"] = "any"
    requires_family: str | None = None
    client_training: bool = True
    setup_statistics: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.dp_units <= DP_UNITS:
            raise ValueError(f"dp_units {sorted(self.dp_units)}: known units are {sorted(DP_UNITS)}")
        if self.private_w_step and not self.collects_label_sets:
            raise ValueError("private_w_step is a W step over collected label sets: it needs collects_label_sets")
        if ("instance" in self.dp_units) != self.private_w_step:
            raise ValueError("the instance DP unit covers the private W step: dp_units has 'instance' iff private_w_step")
        if self.fixed_w and self.trains_rows:  # the DP layer noises row deltas only where W is not fixed
            raise ValueError("fixed_w: W is fixed after setup, so its clients cannot train rows (trains_rows=False)")
        if self.sends_weights and "local" in self.dp_units:  # DP-SGD covers the update, not a weight sent beside it
            raise ValueError(
                "sends_weights: the reported weight is outside DP-SGD in client training; drop 'local' from dp_units"
            )

    @property
    def takes_layers(self) -> bool:
        """Protocol layers apply: there are clients and they send something."""
        return not (self.centralised or self.shares_nothing)
