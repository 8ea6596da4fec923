"""The accountants, behind one interface (:class:`~protocols.dp.accountants.base.Accountant`: ``step``,
``get_epsilon``, ``history``) and one registry.

:data:`ACCOUNTANTS` maps a name (``privacy.accountant``'s value) to its class; :func:`register_accountant` adds one
(a class decorator; a third party's accountant is then used by name everywhere an accountant is named),
:func:`make_accountant` builds a fresh one, :func:`epsilon_of` is the ε of a (σ, q, steps) history by one of them.

Registered here: ``rdp`` (:mod:`.rdp`, Opacus's RDP at the ledger's orders), ``prv`` (:mod:`.prv`, Opacus's PRV) and
``pld`` (:mod:`.pld`, dp-accounting's privacy-loss distribution). All three take histories of Poisson-subsampled
Gaussian steps, add/remove-one neighbours; which of them must hold for a calibrated σ is each class's
``bounds_every_calibration`` (RDP and PRV), plus the run's own.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocols.dp.accountants.base import Accountant, Entry, check_entry

#: name → accountant class; :func:`register_accountant` fills it
ACCOUNTANTS: dict[str, type[Accountant]] = {}


def register_accountant(cls: type[Accountant]) -> type[Accountant]:
    """Register an :class:`Accountant` subclass under its ``name`` (a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Accountant)):
        raise TypeError(f"{cls!r} is not an Accountant subclass")
    if not cls.name:
        raise ValueError(f"{cls.__name__} declares no name")
    if cls.name in ACCOUNTANTS and ACCOUNTANTS[cls.name] is not cls:
        raise ValueError(f"an accountant named {cls.name!r} is already registered ({ACCOUNTANTS[cls.name].__name__})")
    ACCOUNTANTS[cls.name] = cls
    return cls


def accountant_class(name: str) -> type[Accountant]:
    """The registered class of ``name``; ValueError naming the registered ones otherwise."""
    try:
        return ACCOUNTANTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown accountant {name!r}; choose one of {sorted(ACCOUNTANTS)}") from None


def make_accountant(name: str, history: Iterable[Entry] = ()) -> Accountant:
    """A fresh accountant of the registered ``name`` (over ``history``, if given). Its warnings reach the caller."""
    return accountant_class(name)(history)


def epsilon_of(history: Iterable[Entry], delta: float, name: str) -> float:
    """ε at δ of a (σ, q, steps) history by the registered accountant ``name`` (0 for an empty history)."""
    return make_accountant(name, history).get_epsilon(delta)


from protocols.dp.accountants.pld import PLDAccountant  # noqa: E402 - the built-in accountants register below
from protocols.dp.accountants.prv import PRVAccountant  # noqa: E402
from protocols.dp.accountants.rdp import RDPAccountant  # noqa: E402

for _cls in (RDPAccountant, PRVAccountant, PLDAccountant):
    register_accountant(_cls)

__all__ = [
    "ACCOUNTANTS", "Accountant", "Entry", "PLDAccountant", "PRVAccountant", "RDPAccountant", "accountant_class",
    "check_entry", "epsilon_of", "make_accountant", "register_accountant",
]  # fmt: skip
