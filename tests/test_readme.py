"""The README's internal links (its contents line and the cross references) point at headings that exist, with
the anchors GitHub gives them."""

from __future__ import annotations

import re

from tests.conftest import REPO


def github_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces → '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_internal_link_points_at_a_heading():
    text = (REPO / "README.md").read_text()
    in_code = False
    anchors: set[str] = set()
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"#{1,6} (.+)", line)):
            anchors.add(github_anchor(m.group(1)))
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) > 20
    assert sorted({a for a in links if a not in anchors}) == []


def test_the_contents_line_lists_every_section():
    text = (REPO / "README.md").read_text()
    contents = next(line for line in text.splitlines() if line.startswith("**Contents:**"))
    sections = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert re.findall(r"\]\(#([^)]+)\)", contents) == [github_anchor(h) for h in sections]
