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


def _config_fields(model, prefix=""):
    """(dotted path, leaf name) of every field of a config model and of the models it nests."""
    import typing

    from pydantic import BaseModel

    for name, field in model.model_fields.items():
        yield prefix + name, name
        args = typing.get_args(field.annotation) or (field.annotation,)
        for arg in (*args, *(b for a in args for b in typing.get_args(a))):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _config_fields(arg, f"{prefix}{name}.")


def test_every_config_key_is_named_in_the_readme():
    """Each key a user can set (the core's and the plugins' sections) appears in the README's config reference as a
    key: `name`, `.name` or inside a `{…}` mapping, so a new setting cannot land undocumented."""
    from secure_fed.config import ExperimentConfig
    from secure_fed.plugins import registry

    readme = (REPO / "README.md").read_text()
    start = readme.index("## Config reference")
    text = readme[start : readme.index("\n## ", start + 1)]
    roots = [(ExperimentConfig, ""), *((model, f"{name}.") for name, model in registry("config_sections").items())]
    missing = [
        path
        for model, prefix in roots
        for path, name in _config_fields(model, prefix)
        if not re.search(rf"[`.]{re.escape(name)}\b|\{{[^}}\n]*\b{re.escape(name)}\b", text)
    ]
    assert missing == []
