"""An algorithm as the core sees it before a run: :class:`AlgorithmSpec` (light: no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from secure_fed.plugins import load_object

if TYPE_CHECKING:
    from secure_fed.algorithms.capabilities import AlgorithmCapabilities
    from secure_fed.algorithms.params.base import AlgorithmParams


@dataclass(frozen=True)
class AlgorithmSpec:
    """A registered algorithm (built in, or a ``secure_fed.algorithms`` entry point).

    Attributes:
        params: its parameters model (a subclass of :class:`~secure_fed.algorithms.params.base.AlgorithmParams` whose
            ``name`` is a ``Literal`` of the algorithm's name); its ``capabilities`` declare what the algorithm is.
        implementation: ``"module:Class"`` of the :class:`~secure_fed.algorithms.base.Algorithm` (imported by a run).
        description: one line for ``secure-fed list``.
    """

    params: type[AlgorithmParams]
    implementation: str
    description: str = ""

    @property
    def name(self) -> str:
        """The algorithm's name: the default of its params model's ``name`` literal."""
        return self.params.model_fields["name"].annotation.__args__[0]

    @property
    def capabilities(self) -> AlgorithmCapabilities:
        return self.params.capabilities

    def load(self) -> type:
        return load_object(self.implementation)
