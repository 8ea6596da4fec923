"""MkDocs hook: the plugin API's reference page, generated at build time from the code itself.

``docs/reference/plugin-api.md`` holds the marker ``<!-- plugin-api -->``; it is replaced by one table per module of
:mod:`secure_fed.plugin_api` listing every name in its ``__all__``: what it is (class, function, value), where it is
defined and the first sentence of its docstring. A listed name that does not resolve, or a class or function without
a docstring, is an error (``mkdocs build --strict`` fails on it), so the page cannot drift from the code.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

MARKER = "<!-- plugin-api -->"
REPO = Path(__file__).resolve().parents[2]
MODULES = ("secure_fed.plugin_api", "secure_fed.plugin_api.layers", "secure_fed.plugin_api.attacks")

sys.path.insert(0, str(REPO / "docs" / "hooks"))
from module_layout import first_sentence  # noqa: E402 (the hooks folder is not a package)


def _plain(text: str) -> str:
    """Sphinx roles (``:class:`~a.b.C```) as code (```C```), for a Markdown table cell."""
    return re.sub(r":[a-z]+:`~?([^`]+)`", lambda m: f"`{m.group(1).rsplit('.', 1)[-1]}`", text)


def _kind(obj: object) -> str:
    if inspect.isclass(obj):
        return "class"
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return "function"
    return "value"


def render() -> str:
    parts = []
    for name in MODULES:
        module = importlib.import_module(name)
        doc = inspect.getdoc(module) or ""
        intro = doc.split("\n\n")[0]
        parts.append(f"## `{name}`\n\n{intro}\n\n| name | kind | defined in | what it is |\n| --- | --- | --- | --- |")
        for export in module.__all__:
            obj = getattr(module, export)  # AttributeError: a listed name that does not resolve
            kind = _kind(obj)
            text = inspect.getdoc(obj) if kind != "value" else None
            if kind != "value" and not text:
                raise ValueError(f"{name}.{export} has no docstring")
            where = getattr(obj, "__module__", None) or "—"
            parts.append(f"| `{export}` | {kind} | `{where}` | {_plain(first_sentence(text)) if text else ''} |")
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
