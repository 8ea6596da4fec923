"""Every command in a recipe code block parses, at --help cost: each ``secure-fed`` line goes through the CLI's
parser, and the config a command names (with its ``--set`` overrides) through the config loader, without data or
training. So a renamed sub-command, flag or config key fails here before a user copies the recipe."""

from __future__ import annotations

import shlex

import pytest

from tests.conftest import REPO
from tests.docs.pages import code_blocks, page


def _commands() -> list[str]:
    """The recipes' ``secure-fed`` command lines, continuation lines joined and comments dropped."""
    out = []
    for block in code_blocks(page("recipes.md")):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("secure-fed "):
                out.append(line)
    return out


def test_the_recipes_have_commands():
    assert len(_commands()) >= 10


def _no_abbreviations(parser) -> None:
    """Refuse abbreviated flags (argparse would read ``--node`` as ``--nodes``): a recipe spells each flag out."""
    import argparse

    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _no_abbreviations(sub)


@pytest.mark.parametrize("command", _commands())
def test_a_recipe_command_parses(command, monkeypatch):
    from secure_fed.cli import build_parser
    from secure_fed.config import load_config

    monkeypatch.chdir(REPO)
    parser = build_parser()
    _no_abbreviations(parser)
    args = parser.parse_args(shlex.split(command)[1:])
    config = getattr(args, "config", None)
    if config is not None:
        assert (REPO / config).is_file(), config
    overrides = getattr(args, "overrides", None) or []
    if config is not None or overrides:
        load_config(config, overrides)


def test_the_attacks_list_of_a_set_is_quoted_in_every_page():
    """``--set attacks.run=[all]`` unquoted is a glob to zsh ("no matches found"): the docs and the README quote it."""
    import re

    pages = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
    bare = [
        f"{p.relative_to(REPO)}: {m.group(0)}" for p in pages for m in re.finditer(r"--set attacks\.run=\[[^\s]*", p.read_text())
    ]
    assert not bare, bare
