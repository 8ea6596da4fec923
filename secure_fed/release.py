"""What a run releases, tagged: each value a release writer takes (``summary.json``, each ``metrics.jsonl`` line,
the released ``config.yaml``, the file ``secure-fed export`` writes) says why it may leave the run.

Two tags, each a :class:`Released`:

* :func:`public` ``(value, why)``: a function of the config and public facts (the dataset's name, public sizes, the
  hardware), or a post-processing of DP outputs and public data (the released model's metrics on the public test
  split, the privacy ledger); ``why`` says which, in words.
* :func:`protected` ``(value, mechanism)``: a DP output, named by its mechanism: a kind registered in
  ``protocols/dp/mechanisms.py`` (:func:`declare_mechanism` is how that registry tells the core), or
  :data:`RELEASED_MODEL`, the algorithm's released θ and W, which the run's privacy report covers. A value released
  with no mechanism on it is ``protected(value, NO_MECHANISM)``: said out loud, and the run's ε is ∞ for it.

A writer passes its document through :func:`release_fields`: the tags come off, and every field that carries none
(a plain value where a tag belongs; a dict without a tag is walked, each of its keys a field), or that names a
mechanism nobody registered, is a *finding*, one line each (``ε = ∞: summary.json field X is untagged``). Under
strict mode (:data:`STRICT_ENV` set to ``1``, as the test suite sets it) a finding other than
:data:`NO_MECHANISM`'s raises :class:`UntaggedRelease`; in a run the value is still written and the run's reported ε
becomes ∞, with the finding as the one-line why (:func:`with_infinite_epsilon`). Nothing untagged passes silently.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from secure_fed.errors import PrivacyViolation

#: set to ``1``: an untagged released value raises (:class:`UntaggedRelease`) instead of making ε ∞
STRICT_ENV = "SECURE_FED_STRICT_RELEASE"
#: the mechanism of the algorithm's released model (θ and W): its ε is the run's privacy report's (∞ without DP)
RELEASED_MODEL = "released_model"
#: no DP mechanism on the value: released only as the run's ε = ∞ says
NO_MECHANISM = "none"

PUBLIC, PROTECTED = "public", "protected"

#: the mechanism kinds a :func:`protected` tag may name (the DP registry declares its kinds here)
_MECHANISMS: set[str] = {RELEASED_MODEL}


@dataclass(frozen=True)
class Released:
    """A value a release writer may take: ``tag`` is :data:`PUBLIC` (``why`` says why) or :data:`PROTECTED`
    (``why`` names the mechanism)."""

    value: Any
    tag: str
    why: str


def public(value: Any, why: str) -> Released:
    """``value`` is a function of the config and public facts, or a post-processing of DP outputs and public data."""
    if not why or not why.strip():
        raise ValueError("public(value, why): say why the value is public")
    return Released(value, PUBLIC, why)


def protected(value: Any, mechanism: str) -> Released:
    """``value`` is the output of the DP mechanism of kind ``mechanism`` (or of the :data:`RELEASED_MODEL`;
    :data:`NO_MECHANISM` when none covers it)."""
    if not mechanism:
        raise ValueError("protected(value, mechanism): name the mechanism")
    return Released(value, PROTECTED, mechanism)


def declare_mechanism(kind: str) -> None:
    """Let :func:`protected` tags name ``kind`` (``protocols.dp.mechanisms.register_mechanism`` calls it)."""
    _MECHANISMS.add(kind)


def strict() -> bool:
    """Whether an untagged released value raises (:data:`STRICT_ENV` is ``1``)."""
    return os.environ.get(STRICT_ENV) == "1"


class UntaggedRelease(PrivacyViolation):
    """A release writer got a value without a tag (strict mode): a programming error in the writer."""


#: how every finding's line begins (and so how a privacy report's why tells them from its own reasons)
FINDING_PREFIX = "ε = ∞: "


def untagged_line(file: str, field: str) -> str:
    """The one-line why of the ε an untagged field makes ∞."""
    return f"{FINDING_PREFIX}{file} field {field} is untagged"


def findings_in(privacy: Mapping[str, Any]) -> list[str]:
    """The release findings a privacy report's ``why`` carries (:func:`with_infinite_epsilon` put them there)."""
    return [x for x in str(privacy.get("why") or "").split("; ") if x.startswith(FINDING_PREFIX)]


def _check_tag(value: Released, file: str, path: str, found: list[tuple[str, bool]]) -> None:
    """A finding for a tag that releases with no mechanism, or names one that is not registered."""
    if value.tag == PROTECTED and value.why == NO_MECHANISM:
        found.append((f"{FINDING_PREFIX}{file} field {path} is released with no DP mechanism on it", False))
    elif value.tag == PROTECTED and value.why not in _MECHANISMS:
        line = f"{FINDING_PREFIX}{file} field {path} names mechanism {value.why!r}, which is not registered"
        found.append((line, True))


def _walk(value: Any, file: str, path: str, found: list[tuple[str, bool]]) -> Any:
    """``value`` without its tags; a finding ``(line, raises)`` for each untagged field under ``path``."""
    if isinstance(value, Released):
        _check_tag(value, file, path, found)
        return _walk_tagged(value.value, file, path, found)
    if isinstance(value, Mapping):
        return {k: _walk(v, file, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple) and value and all(isinstance(v, Released | Mapping) for v in value):
        return type(value)(_walk(v, file, f"{path}[{i}]", found) for i, v in enumerate(value))
    found.append((untagged_line(file, path), True))
    return value


def _walk_tagged(value: Any, file: str, path: str, found: list[tuple[str, bool]]) -> Any:
    """A tagged value without the tags nested inside it: a tag covers everything under it, but a nested tag that
    releases with no mechanism, or names an unregistered one, is still a finding."""
    if isinstance(value, Released):
        _check_tag(value, file, path, found)
        return _walk_tagged(value.value, file, path, found)
    if isinstance(value, Mapping):
        return {k: _walk_tagged(v, file, f"{path}.{k}", found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_walk_tagged(v, file, f"{path}[{i}]", found) for i, v in enumerate(value))
    return value


def release_fields(doc: Mapping[str, Any], file: str) -> tuple[dict[str, Any], list[str]]:
    """``doc`` (field → :class:`Released`, or a dict of them) without its tags, and the findings: one line per
    field that is untagged, names an unregistered mechanism, or is released with :data:`NO_MECHANISM`. Strict mode
    raises :class:`UntaggedRelease` on the first finding other than :data:`NO_MECHANISM`'s."""
    found: list[tuple[str, bool]] = []
    plain = {k: _walk(v, file, str(k), found) for k, v in doc.items()}
    if strict() and (bad := [line for line, raises in found if raises]):
        raise UntaggedRelease(f"{bad[0]} (strict release: {STRICT_ENV}=1)")
    return plain, [line for line, _ in found]


def with_infinite_epsilon(privacy: Mapping[str, Any] | None, findings: list[str]) -> dict[str, Any]:
    """A privacy report (``summary.json``'s, a metrics line's, an export's) with ε = ∞ and the ``findings`` after
    any ``why`` it already has, on one line, and each unit's ε against each adversary (``units.*.adversaries``: the
    released model's) ∞ with the same findings; a unit's own ledger ε stays (it still bounds what its mechanisms
    spent). Unchanged (a copy) without findings."""
    out = dict(privacy or {"epsilon": "inf", "delta": None})
    if findings:
        out["epsilon"] = "inf"
        out["why"] = "; ".join([*([out["why"]] if out.get("why") else []), *findings])
        units = out.get("units")
        if isinstance(units, Mapping):
            out["units"] = {name: _released_inf(u, findings) for name, u in units.items()}
    return out


def _released_inf(unit: Any, findings: list[str]) -> Any:
    """A unit's report with its released-model ε per adversary made ∞ by ``findings``."""
    if not isinstance(unit, Mapping) or not isinstance(unit.get("adversaries"), Mapping):
        return unit
    why = "; ".join(findings)
    return {**unit, "adversaries": {a: {**v, "epsilon": "inf", "why": why} if isinstance(v, Mapping) else v
                                    for a, v in unit["adversaries"].items()}}  # fmt: skip


__all__ = [
    "FINDING_PREFIX", "NO_MECHANISM", "PROTECTED", "PUBLIC", "RELEASED_MODEL", "STRICT_ENV", "Released",
    "UntaggedRelease", "declare_mechanism", "findings_in", "protected", "public", "release_fields", "strict",
    "untagged_line", "with_infinite_epsilon",
]  # fmt: skip
