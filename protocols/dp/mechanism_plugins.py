"""DP mechanisms as plugins: a mechanism registered by a ``secure_fed.mechanisms`` entry point, which the ``dp`` layer
discovers, runs once before round 0 and charges to its ledgers (light: pydantic and the standard library; the
run's half is :mod:`protocols.dp.plugin_release`).

A plugin releases one *statistic*: the Gaussian-noised sum over every client of a vector each client computes from its
own data, each vector bounded so that the sum's L2 sensitivity is a public function of the config. Its
:class:`MechanismSpec` says

* ``settings``: its pydantic model, which becomes its own sub-section ``privacy.<name>:`` (null, the default: off);
  it must carry ``noise_multiplier`` (σ, in multiples of the instance sensitivity) or ``target_epsilon`` (σ
  calibrated with the instance unit's other mechanisms to that one target), as the units' sections do; a field
  ``max_labels_per_instance`` joins the run's one contribution bound (``PrivacyConfig.max_labels_per_instance``);
* ``statistic``: the key of what it releases; an algorithm asks for it in its setup exchange with the payload
  ``{"statistic": <key>}`` and reads the reply under that key (under ``dp`` with the plugin set the layer answers with
  the one released sum, from no client: ``cid`` -1; without ``dp`` the clients answer with their own exact vectors);
  an algorithm that releases the statistic declares it (``AlgorithmCapabilities.setup_statistics``), and under
  ``dp`` without the plugin its channel is un-noised (ε ∞);
* ``client``: ``"module:function"`` of the client side, ``function(section, data, *, instance_bound, client_clip)``:
  the client's vector from its own :class:`~secure_fed.algorithms.base.ClientData` alone, each instance's
  contribution bounded in L2 by ``instance_bound`` and, where the client unit exists (``privacy.client``), the
  whole vector clipped in L2 to ``client_clip``;
* ``sensitivity(section, unit)``: the L2 sensitivity of the sum for ``unit`` (``instance``: one training instance
  added or removed; ``client``: one client), a function of the section alone;
* ``client_clip(section)``: the client vector's L2 clip under ``privacy.client`` (the client unit's sensitivity).

The layer declares it for the ledger as one step at q = 1 of a Gaussian of std σ·Δ_instance (the discrete Gaussian
of :func:`protocols.dp.discrete_gaussian.noisy_sum`): in the instance unit at noise multiplier σ, and, with
``privacy.client``, in the client unit at σ·Δ_instance/Δ_client. The server sums the clients' bounded vectors and
adds the noise itself (``noise_by: server``, as the W step over label sets): the ε holds against an observer of the
release, not against the server, which sees each client's bounded vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from secure_fed.plugin_api.layers import load_object, registry


@dataclass(frozen=True)
class MechanismSpec:
    """A DP mechanism plugin, as the core and ``validate`` see it (see the module docstring)."""

    name: str
    settings: type
    statistic: str
    client: str
    sensitivity: Callable[[Any, str], float]
    client_clip: Callable[[Any], float]
    description: str = ""

    def client_function(self) -> Callable[..., Any]:
        """The client side (imported when a run needs it)."""
        return load_object(self.client)


def mechanism_specs() -> dict[str, MechanismSpec]:
    """The registered mechanism plugins by name (the ``secure_fed.mechanisms`` entry points)."""
    out: dict[str, MechanismSpec] = {}
    for key, spec in registry("mechanisms").items():
        if not isinstance(spec, MechanismSpec):
            raise RuntimeError(f"entry point secure_fed.mechanisms:{key} is not a MechanismSpec ({type(spec).__name__})")
        if spec.name in out:
            raise RuntimeError(f"entry point secure_fed.mechanisms:{key} registers mechanism {spec.name!r}, which is taken")
        out[spec.name] = spec
    return out


def active_plugins(privacy) -> list[tuple[MechanismSpec, Any]]:
    """The plugins a ``privacy`` section sets (its sub-section not null), with their sections, in name order."""
    return [(spec, s) for name, spec in mechanism_specs().items() if (s := getattr(privacy, name, None)) is not None]


def plugin_channel(statistic: str) -> str:
    """The privacy graph's channel of a released statistic."""
    return f"statistic:{statistic}"


def plugin_sigma_source_error(privacy) -> str | None:
    """Why an active plugin has no σ: neither its noise_multiplier nor a target ε (its own or the instance unit's)."""
    unit_targets = [u.target_epsilon for u in (privacy.instance, privacy.local) if u is not None]
    for spec, s in active_plugins(privacy):
        if s.noise_multiplier is None and s.target_epsilon is None and not any(t is not None for t in unit_targets):
            return (f"privacy.{spec.name} sets neither noise_multiplier nor target_epsilon: its σ has nothing to come "
                    "from; give noise_multiplier, or a target_epsilon to calibrate σ to")  # fmt: skip
    return None


def plugin_combination_error(privacy) -> str | None:
    """Why an active plugin cannot run beside the rest of ``privacy``, or None.

    - Beside ``privacy.client`` with the tree or banded mechanism: those units rebuild their ledger from their own
      mechanism, which would leave the plugin's release out of the client unit's ε and its budget stop.
    - Beside a ``privacy.client`` target ε: the client unit's σ is calibrated to its target before the plugin's release
      joins its ledger, so the run would stop on the budget long before its planned rounds.
    - With a target ε of its own beside the instance unit's (``privacy.instance`` or ``privacy.local``): the instance
      unit calibrates every instance-level σ to one target, and two targets for one ledger would leave one unmet."""
    plugins = active_plugins(privacy)
    if not plugins:
        return None
    names = ", ".join(f"privacy.{spec.name}" for spec, _ in plugins)
    client = privacy.client
    if client is not None and client.mechanism in ("tree", "banded"):
        return (f"{names} with privacy.client.mechanism: {client.mechanism}: that mechanism's ledger composes only its own "
                "noise, so the release would be left out of the client unit's ε; use mechanism: gaussian")  # fmt: skip
    if client is not None and client.target_epsilon is not None:
        return (f"{names} with privacy.client.target_epsilon: the client unit's σ is calibrated to its target without "
                "the release, which also enters its ledger; give privacy.client.noise_multiplier instead")  # fmt: skip
    unit_targets = [u.target_epsilon for u in (privacy.instance, privacy.local) if u is not None and u.target_epsilon]
    own = [f"privacy.{spec.name}" for spec, s in plugins if s.target_epsilon is not None]
    if own and unit_targets:
        return (f"{', '.join(own)}.target_epsilon beside the instance unit's target (privacy.instance / privacy.local): "
                "one instance ledger takes one target; give the plugin a noise_multiplier, or drop one target")  # fmt: skip
    return None


__all__ = [
    "MechanismSpec",
    "active_plugins",
    "mechanism_specs",
    "plugin_channel",
    "plugin_combination_error",
    "plugin_sigma_source_error",
]
