"""Load, override and validate experiment configs with one-line errors."""

from __future__ import annotations

import copy
import difflib
import typing
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from secure_fed.algorithms.registry import DEFAULT_ALGORITHM, algorithm_specs
from secure_fed.config.plan_builder import build_plan, dump_config  # noqa: F401 - dump_config: read here by name
from secure_fed.config.schema import CoreConfig, experiment_config_model
from secure_fed.errors import ConfigError, unknown_name
from secure_fed.plan import RunPlan
from secure_fed.plugins import registry


def default_config_text() -> str:
    return resources.files("secure_fed.config").joinpath("default.yaml").read_text()


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error, not a silent overwrite."""


def _mapping_without_duplicates(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise yaml.constructor.ConstructorError(None, None, "a key must be a plain name", key_node.start_mark)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text → Python data, with one-line errors naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply to be a config") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        hint = " (to continue a run: secure-fed resume RUN_DIR)" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"{path} is a directory, not a config file{hint}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); a config is a UTF-8 YAML file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror})") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: not a text file (it holds NUL bytes); a config is a UTF-8 YAML file")
    data = parse_yaml(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides; values are parsed as YAML (``1e-3``, ``[1,2]``, ``true``)."""
    data = copy.deepcopy(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key.path=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        except (yaml.YAMLError, RecursionError):
            value = raw
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"--set {key}: '{p}' is not a section")
            node = nxt
        node[parts[-1]] = value
    return data


def _apply(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` with ``overrides`` applied, in order. Each ``--set algorithm.name=X`` (a sweep's cell too) switches the
    algorithm: the ``algorithm:`` keys given before it (by the file, or by earlier ``--set``) that X does not take are
    left out, since they were the previous algorithm's; keys set after it are X's, refused if X does not take them."""
    out = data
    for item in overrides:
        before, out = out, apply_overrides(out, [item])
        if item.split("=", 1)[0].strip() != "algorithm.name":
            continue
        old, new = before.get("algorithm"), out.get("algorithm")
        if isinstance(old, dict) and isinstance(new, dict):
            name = new.get("name")
            spec = algorithm_specs().get(name) if isinstance(name, str) else None
            if spec is not None and old.get("name", DEFAULT_ALGORITHM) != name:
                out["algorithm"] = {k: v for k, v in new.items() if k in spec.params.model_fields}
    return out


def _algorithm_tag(loc: tuple) -> str | None:
    """The algorithm name a pydantic error location carries after ``algorithm`` (the discriminated union's tag)."""
    if len(loc) > 1 and loc[0] == "algorithm" and isinstance(loc[1], str) and loc[1] in algorithm_specs():
        return loc[1]
    return None


def _plain_loc(loc: tuple) -> tuple:
    """The location as the YAML spells it: without the algorithm union's tag."""
    return (loc[0], *loc[2:]) if _algorithm_tag(loc) else loc


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds: itself, or the one model of an optional (``Model | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [m for m in typing.get_args(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return models[0] if len(models) == 1 else None


def _section_model(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model of the section that holds the key at ``loc`` (the last part), or None."""
    cur: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = getattr(cur, "model_fields", {}).get(part)
        if field is None:
            return None
        cur = _model_in(field.annotation)
        if cur is None:
            return None
    return cur


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    return list(getattr(_section_model(model, loc), "model_fields", {}))


def _deeper_hints(model: type[BaseModel], loc: tuple) -> list[str]:
    """For an unknown key with no close match in its own section: the keys of the section's sub-sections that match
    it, as full paths (``privacy.epsilon`` → ``privacy.instance.target_epsilon``, ``privacy.local.target_epsilon``...)."""
    section = _section_model(model, loc)
    if section is None:
        return []
    word, prefix = str(loc[-1]), ".".join(str(p) for p in loc[:-1] if not isinstance(p, int))
    hints = []
    for name, field in section.model_fields.items():
        sub = _model_in(field.annotation)
        if sub is not None:
            keys = list(sub.model_fields)
            close = difflib.get_close_matches(word, keys, n=1) or [k for k in keys if word in k.split("_")]
            hints += [f"{prefix}.{name}.{k}" if prefix else f"{name}.{k}" for k in close[:1]]
    return hints


def format_validation_error(exc: ValidationError, source: str) -> str:
    """First error as one line: ``SOURCE: key.path: message``."""
    err = exc.errors()[0]
    raw = tuple(err.get("loc", ()))
    tag, loc = _algorithm_tag(raw), _plain_loc(raw)
    path = ".".join(str(p) for p in loc) or "(top level)"
    if err["type"] == "extra_forbidden":
        known = list(algorithm_specs()[tag].params.model_fields) if tag else _known_keys(experiment_config_model(), loc)
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1)
        deeper = [] if hint or tag else _deeper_hints(experiment_config_model(), loc)
        msg = "unknown key" + (f" (did you mean '{hint[0]}'?)" if hint else "")
        if deeper:
            msg += " (did you mean " + " or ".join(f"'{h}'" for h in deeper) + "?)"
        if tag and not hint:
            msg += f"; algorithm.name={tag} takes {', '.join(k for k in known if k != 'name') or 'no other key'}"
        if len(loc) == 1 and not registry("config_sections"):
            msg += " (no plugin registered any config section: is secure-fed installed? pip install -e .)"
    elif err["type"] == "union_tag_invalid" and loc == ("algorithm",):
        path, msg = "algorithm.name", unknown_name("algorithm", str(err.get("ctx", {}).get("tag")), algorithm_specs())
    else:
        msg = err["msg"].removeprefix("Value error, ")
        if "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
            msg += f" (got {err['input']!r})"
    more = len(exc.errors()) - 1
    tail = f" [+{more} more]" if more else ""
    return f"{source}: {path}: {msg}{tail}"


def check_override_syntax(overrides: list[str], path: Any = None) -> None:
    """Each ``--set`` must be ``key.path=value``. Checked before the config file is read: ``--set training.rounds 5``
    leaves ``5`` as the command's CONFIG argument, and its real mistake is the missing ``=``, not a missing file."""
    for item in overrides:
        if "=" not in item:
            stray = isinstance(path, str | Path) and not Path(path).exists() and " " not in str(path)
            fix = f"--set {item}={path}" if stray else f"--set {item}=VALUE"
            raise ConfigError(f"--set {item}: missing '=' between the key and its value (write {fix}, with no space)")


def raw_config(path: str | Path | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The YAML document ``path`` (or the embedded default) with ``overrides`` applied, as plain data: not validated
    (what a caller reads before it decides further overrides)."""
    check_override_syntax(list(overrides or []), path)
    data = parse_yaml(default_config_text(), "default config") if path is None else _read_yaml(Path(path))
    return _apply(data or {}, list(overrides or []))


def load_config(
    path: str | Path | Mapping[str, Any] | CoreConfig | None = None, overrides: list[str] | None = None
) -> CoreConfig:
    """Load ``path`` (or the embedded default), apply ``overrides`` (``key=value``, as ``--set``) and validate.
    ``path`` may also be a mapping, read as the YAML document it stands for (sections left out take their defaults),
    or a loaded config (returned as is without overrides)."""
    if isinstance(path, CoreConfig):
        if not overrides:
            return path
        path = path.model_dump(mode="json")
    check_override_syntax(list(overrides or []), path)
    if path is None:
        data, source = parse_yaml(default_config_text(), "default config"), "default config"
    elif isinstance(path, Mapping):
        data, source = copy.deepcopy(dict(path)), "the config mapping"
    else:
        data, source = _read_yaml(Path(path)), str(path)
    overrides = list(overrides or [])
    try:
        return experiment_config_model().model_validate(_apply(data, overrides))
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, _source_of(exc, source, data, overrides))) from None


def _source_of(exc: ValidationError, source: str, data: dict[str, Any], overrides: list[str]) -> str:
    """Where the first error comes from, as the error line names it: the last ``--set`` that wrote its key (or a
    mapping holding it, or a key under the unknown one), else, when the file alone is valid, the first ``--set``
    that makes it invalid (an error with no key, e.g. a cross-field check), else the file."""
    loc = ".".join(str(p) for p in _plain_loc(tuple(exc.errors()[0].get("loc", ()))) if not isinstance(p, int))
    for item in reversed(overrides):
        key = item.split("=", 1)[0].strip()
        if loc and (loc == key or loc.startswith(key + ".") or key.startswith(loc + ".")):
            return f"--set {item}"
    if overrides and _valid(data):  # the error path only: a few validations of small documents
        for i, item in enumerate(overrides):
            if not _valid(_apply(data, overrides[: i + 1])):
                return f"--set {item}"
    return source


def _valid(data: dict[str, Any]) -> bool:
    try:
        experiment_config_model().model_validate(data)
    except (ValidationError, ConfigError):
        return False
    return True


def load_plan(source: Any = None, overrides: list[str] | None = None) -> RunPlan:
    """The plan of ``source`` (a YAML path, a mapping, None: the embedded default; also a plan or a loaded config,
    returned as is, or planned again with ``overrides``) with ``overrides`` applied (:func:`load_config`'s one-line
    :class:`~secure_fed.errors.ConfigError` for a bad one)."""
    if isinstance(source, RunPlan):
        if not overrides:
            return source
        source = yaml.safe_load(source.config_yaml)
    return build_plan(load_config(source, overrides))


def config_secret_paths() -> list[tuple[str, ...]]:
    """The key paths of every setting a config section marks secret (:mod:`secure_fed.secret_settings`), plugin
    sections included: what the released ``config.yaml`` and ``secure-fed export`` leave out."""
    from secure_fed.secret_settings import secret_paths

    return secret_paths(experiment_config_model())


def first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two config documents first differ, as ``key.path: A there, B now``."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
    return f"{path}: {a!r} there, {b!r} now"
