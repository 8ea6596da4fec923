"""Reading the documentation in tests: the pages, their headings' anchors, their links and their code blocks."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

DOCS = REPO / "docs"


def pages() -> list[Path]:
    """Every markdown page of the site, and the README (which links into it)."""
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def page(relative: str) -> str:
    return (DOCS / relative).read_text()


def anchor(heading: str) -> str:
    """The anchor of a heading, as GitHub and the site (pymdownx.slugs.slugify, case: lower) make it: lower case,
    punctuation dropped (hyphens and underscores kept), each space a hyphen."""
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, code = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            code = not code
        elif not code:
            out.append(line)
    return out


def anchors(text: str) -> set[str]:
    return {anchor(m.group(1)) for line in prose_lines(text) if (m := re.match(r"#{1,6} (.+)", line))}


def links(text: str) -> list[str]:
    """The targets of markdown links and images outside code blocks (inline code spans removed first)."""
    found = []
    for line in prose_lines(text):
        found += re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line))
    return found


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
