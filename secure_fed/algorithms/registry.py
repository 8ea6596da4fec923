"""The registered algorithms, by name: the ``secure_fed.algorithms`` entry points, the package's own and third parties'.

Light (no torch): ``secure-fed validate`` builds the ``algorithm:`` section from :func:`algorithm_specs`. A built-in
algorithm is registered by its entry point in ``pyproject.toml`` alone (read from the source tree too, before an
editable install records it: :func:`secure_fed.plugins.source_entry_points`); a third party declares one the same
way::

    [project.entry-points."secure_fed.algorithms"]
    my_algorithm = "my_package.params:MY_ALGORITHM_SPEC"   # an AlgorithmSpec: params model + "module:Class"

An algorithm then validates, runs and meets the protocol layers through its spec's params model and capabilities
alone, with no change to ``secure_fed`` or ``protocols``. A built-in may hold its params, spec and implementation in
one module of ``secure_fed.algorithms`` whose implementation is built when first asked (the module's ``__getattr__``),
so that reading the spec imports no torch.
"""

from __future__ import annotations

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.spec import AlgorithmSpec
from secure_fed.plugins import registry, source_entry_points

#: the algorithm of a config that names none (``algorithm:`` without ``name``)
DEFAULT_ALGORITHM = "fedalc"


def _entry_specs() -> dict[str, AlgorithmSpec]:
    """Entry point name → spec, the source tree's entry points first in their ``pyproject.toml`` order."""
    loaded = registry("algorithms")
    order = [k for k in source_entry_points("algorithms") if k in loaded]
    out = {}
    for key in [*order, *(k for k in loaded if k not in order)]:
        spec = loaded[key]
        if not isinstance(spec, AlgorithmSpec):
            raise RuntimeError(f"entry point secure_fed.algorithms:{key} is not an AlgorithmSpec ({type(spec).__name__})")
        out[key] = spec
    return out


def builtin_specs() -> dict[str, AlgorithmSpec]:
    """The package's own algorithms (their params in ``secure_fed``), by name."""
    return {s.name: s for s in _entry_specs().values() if s.params.__module__.split(".")[0] == "secure_fed"}


def algorithm_specs() -> dict[str, AlgorithmSpec]:
    """Every registered algorithm by name: the built-ins, then the other entry points (another spec under a taken
    name is an error)."""
    specs = builtin_specs()
    for key, spec in _entry_specs().items():
        if spec.name in specs and specs[spec.name] is not spec:
            raise RuntimeError(f"entry point secure_fed.algorithms:{key} registers algorithm {spec.name!r}, which is taken")
        specs.setdefault(spec.name, spec)
    return specs


def capabilities(name: str) -> AlgorithmCapabilities:
    """The declared capabilities of algorithm ``name``."""
    return algorithm_specs()[name].capabilities


class AlgorithmsWith:
    """The names of the registered algorithms whose capability ``flag`` is set, read when asked (``name in ...``),
    so that entry points registered later count."""

    def __init__(self, flag: str):
        if flag not in AlgorithmCapabilities.__dataclass_fields__:
            raise ValueError(f"unknown capability {flag!r}")
        self.flag = flag

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, s in algorithm_specs().items() if getattr(s.capabilities, self.flag))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self):
        return iter(self.names())

    def __repr__(self) -> str:
        return f"AlgorithmsWith({self.flag!r}: {', '.join(self.names())})"
