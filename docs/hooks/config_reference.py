"""MkDocs hook: the config reference's key tables, generated from the pydantic schema when the site is built.

``docs/reference/config.md`` holds the marker ``<!-- config-reference -->``; at build time it is replaced by one
table per config section (the core's ``secure_fed.config.schema`` and every section that a plugin registers under
``secure_fed.config_sections``), read from ``ExperimentConfig.model_json_schema()``: each key with its type, default,
bounds and the field's description. Nothing is written by hand, so the tables cannot drift from the schema. Unions of
models (``X | None``, or a discriminated union such as ``algorithm`` on ``algorithm.name``) get one table per variant.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

MARKER = "<!-- config-reference -->"

_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"),
    ("pattern", "matches `{}`"),
)


def _prose(text: str) -> str:
    """A docstring or description as one markdown line (reST's ``literal`` and :role:`x` become code)."""
    text = re.sub(r":[a-z]+:`([^`]+)`", r"`\1`", " ".join(str(text).split()))
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _prose(text).replace("|", "\\|")


class _Schema:
    """A JSON schema with its ``$defs``, and the walk that turns it into sections of key rows."""

    def __init__(self, schema: dict):
        self.schema = schema
        self.defs = schema.get("$defs", {})

    def resolve(self, node: dict) -> dict:
        """Follow ``$ref`` (and pydantic's single-element ``allOf`` wrapper) to the node it names."""
        while True:
            if "$ref" in node:
                node = {**self.defs[node["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
            elif len(node.get("allOf", ())) == 1:
                node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
            else:
                return node

    def variants(self, node: dict) -> list[dict]:
        return [self.resolve(v) for v in node.get("anyOf", node.get("oneOf", []))]

    def models(self, node: dict) -> list[dict]:
        """The object models a field holds: itself, or the object members of its union."""
        node = self.resolve(node)
        if "properties" in node:
            return [node]
        return [v for v in self.variants(node) if "properties" in v]

    def type_name(self, node: dict) -> str:
        node = self.resolve(node)
        if "const" in node:
            return f"`{json.dumps(node['const'])}`"
        if "enum" in node:
            return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
        if "properties" in node:
            return f"section `{node.get('title', 'object')}`"
        if self.variants(node):
            return " \\| ".join(dict.fromkeys(self.type_name(v) for v in self.variants(node)))
        kind = node.get("type", "any")
        if kind == "array":
            items = node.get("items")
            if isinstance(items, dict) and items:
                return f"list of {self.type_name(items)}"
            if "prefixItems" in node:
                return "(" + ", ".join(self.type_name(i) for i in node["prefixItems"]) + ")"
            return "list"
        if kind == "object" and isinstance(node.get("additionalProperties"), dict):
            return f"mapping to {self.type_name(node['additionalProperties'])}"
        return kind if isinstance(kind, str) else " \\| ".join(kind)

    def bounds(self, node: dict) -> str:
        found = []
        for member in [self.resolve(node), *self.variants(node)]:
            found += [fmt.format(member[key]) for key, fmt in _BOUNDS if key in member]
        return ", ".join(dict.fromkeys(found))

    def sections(self, model: dict, path: str, label: str = "") -> Iterator[tuple[str, str, dict, list[tuple]]]:
        """(dotted path, variant label, model node, rows) for ``model`` and every model nested in it."""
        rows, nested = [], []
        for name, field in model.get("properties", {}).items():
            key = f"{path}.{name}" if path else name
            if name in model.get("required", ()):
                default = "required"
            elif "default" not in field:
                default = "computed"  # a default_factory: the schema does not state the value
            elif self.models(field) and isinstance(field["default"], dict):
                default = "its section's"
            else:
                default = f"`{_cell(json.dumps(field['default'], ensure_ascii=False))}`"
            description = field.get("description") or self.resolve(field).get("description", "")
            rows.append((key, self.type_name(field), default, self.bounds(field), description))
            members = self.models(field)
            node = self.resolve(field)
            tag = node.get("discriminator", {}).get("propertyName")
            for member in members:
                variant = ""
                if tag or len(members) > 1:
                    const = member["properties"].get(tag or "", {})
                    value = const.get("const", (const.get("enum") or [None])[0] if "enum" in const else None)
                    variant = f"{tag}: {value}" if tag and value is not None else member.get("title", "")
                nested.append((member, key, variant))
        yield path, label, model, rows
        for member, key, variant in nested:
            yield from self.sections(member, key, variant)


def config_keys() -> list[str]:
    """Every dotted key the generated reference lists (the tests compare it with the pydantic models)."""
    return [row[0] for _, _, _, rows in _Schema(_schema()).sections(_schema(), "") for row in rows]


def _schema() -> dict:
    from secure_fed.config import ExperimentConfig

    return ExperimentConfig.model_json_schema()


def render() -> str:
    """The markdown for every section: a heading, the model's docstring, and its key table."""
    from secure_fed.plugins import registry

    plugins = {name: f"{model.__module__}.{model.__qualname__}" for name, model in registry("config_sections").items()}
    schema = _schema()
    out = []
    for path, label, model, rows in _Schema(schema).sections(schema, ""):
        if not rows:
            continue
        title = f"`{path}`" if path else "Top level"
        if label:
            title += f" (`{label}`)"
        out += [f"### {title}", ""]
        root = path.split(".", 1)[0]
        if path == root and root in plugins:
            out += [f"*Plugin section*, registered under `secure_fed.config_sections` by `{plugins[root]}`.", ""]
        if path and model.get("description"):
            out += [_prose(model["description"]), ""]
        out += ["| key | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{key}` | {t} | {d} | {_cell(b)} | {_cell(desc)} |" for key, t, d, b, desc in rows]
        out.append("")
    return "\n".join(out)


def on_config(config):
    """Import the packages of the checkout being documented (the repository root, where mkdocs.yml is)."""
    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    return config


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    """Replace the marker with the generated tables (only the config reference page has it)."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
