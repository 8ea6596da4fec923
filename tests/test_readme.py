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


def _commands(parser, prefix=()):
    """(sub-command path, its flags and positional names) for every leaf of the ``secure-fed`` parser."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
            return
    names = set()
    for action in parser._actions:
        if not isinstance(action, argparse._HelpAction):
            names.add(action.option_strings[-1] if action.option_strings else action.dest.upper())
    yield " ".join(prefix), names


def test_the_command_table_lists_every_sub_command_and_flag():
    from secure_fed.cli import build_parser

    text = (REPO / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z][a-z -]*)`(?: \([^)]*\))? \| (.*) \|$", text, flags=re.M))
    for command, names in _commands(build_parser()):
        assert command in rows, f"README's command table has no row for `{command}`"
        flags = set(re.findall(r"--[a-z-]+", rows[command]))
        assert flags == {n for n in names if n.startswith("--")}, command
