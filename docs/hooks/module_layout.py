"""MkDocs hook: the Layout page's table of modules, generated at build time from the code itself.

``docs/layout.md`` holds the marker ``<!-- module-layout -->``; it is replaced by one table per package listing every
module (``ast``, nothing imported) with the first sentence of its docstring, so the page cannot name a file that is
gone or miss a new one. A module without a docstring is an error (``mkdocs build --strict`` fails on it).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

MARKER = "<!-- module-layout -->"
REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("secure_fed", "protocols", "threat_models")


def first_sentence(doc: str) -> str:
    """The docstring's first paragraph up to its first full stop (at most 200 characters), for a table cell."""
    text = " ".join(doc.split("\n\n")[0].split())
    m = re.match(r"(.+?\.)(\s|$)", text)
    text = m.group(1) if m else text
    return (text if len(text) <= 200 else text[:199] + "…").replace("|", "\\|")


def modules(package: str) -> list[tuple[str, str | None]]:
    """``(path relative to the repo, first sentence of its docstring or None)`` for every module of ``package``."""
    out = []
    for path in sorted((REPO / package).rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        out.append((path.relative_to(REPO).as_posix(), first_sentence(doc) if doc else None))
    return out


def render() -> str:
    parts = []
    for package in PACKAGES:
        rows = modules(package)
        missing = [p for p, d in rows if d is None and not p.endswith("__init__.py")]
        if missing:
            raise ValueError(f"modules without a docstring: {missing}")
        parts.append(f"## `{package}/`\n\n| module | what it holds |\n| --- | --- |")
        parts.extend(f"| `{p}` | {d or ''} |" for p, d in rows if d is not None)
        parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
