"""The registered algorithms, by name: the built-ins and the ``secure_fed.algorithms`` entry points.

Light (no torch): ``secure-fed validate`` builds the ``algorithm:`` section from :func:`algorithm_specs`. The
built-ins are listed here as well as in ``pyproject.toml``'s entry points, so that they are found where the installed
metadata predates the group (an editable install made before it); entry points add third-party algorithms::

    [project.entry-points."secure_fed.algorithms"]
    my_algorithm = "my_package.params:MY_ALGORITHM_SPEC"   # an AlgorithmSpec: params model + "module:Class"

A third-party algorithm then validates, runs and meets the protocol layers through its spec's params model and
capabilities alone, with no change to ``secure_fed`` or ``protocols``.
"""

from __future__ import annotations

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.spec import AlgorithmSpec
from secure_fed.plugins import load_object, registry

#: the built-in algorithms' specs (``module:attr``), in the order ``secure-fed list`` prints them
BUILTIN = (
    "secure_fed.algorithms.params.fedavg:FEDAVG",
    "secure_fed.algorithms.params.fedavg:FEDAVG_FIXED",
    "secure_fed.algorithms.params.fedaws:FEDAWS",
    "secure_fed.algorithms.params.fedalc:FEDALC",
    "secure_fed.algorithms.params.fedalc:FEDALC_FIXED",
    "secure_fed.algorithms.params.flag:FLAG",
    "secure_fed.algorithms.params.oracle:ORACLE",
    "secure_fed.algorithms.params.local:LOCAL",
    "secure_fed.algorithms.params.oracle:CENTRALISED",
    "secure_fed.algorithms.params.fedlgt:FEDCTRAN",
    "secure_fed.algorithms.params.fedlgt:FEDLGT",
)
#: the algorithm of a config that names none (``algorithm:`` without ``name``)
DEFAULT_ALGORITHM = "fedalc"


def builtin_specs() -> dict[str, AlgorithmSpec]:
    """The built-in algorithms, by name (no entry points read)."""
    specs = [load_object(path) for path in BUILTIN]
    return {spec.name: spec for spec in specs}


def algorithm_specs() -> dict[str, AlgorithmSpec]:
    """Every registered algorithm by name: the built-ins, then the ``secure_fed.algorithms`` entry points (an entry
    point may repeat a built-in's spec, as the package's own do; another spec under a taken name is an error)."""
    specs = builtin_specs()
    for key, spec in registry("algorithms").items():
        if not isinstance(spec, AlgorithmSpec):
            raise RuntimeError(f"entry point secure_fed.algorithms:{key} is not an AlgorithmSpec ({type(spec).__name__})")
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
