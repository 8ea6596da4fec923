"""The README stays short and its commands stay the ones CI runs; the docs pages it links to hold the rest
(tests/docs/ checks those: links, recipes, the command table, the config reference)."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.docs.pages import code_blocks, page


def _test_command(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("(command -v chromedriver"))


def test_the_readme_is_at_most_200_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 200


def test_the_two_commands_are_the_ones_ci_and_the_docs_run():
    """README command 2 is .ci/run's command, word for word, and Getting started shows the same two commands."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## The two commands") :]
    blocks = code_blocks(section)
    assert "pip install -e . && secure-fed run" in blocks[0]
    command = _test_command(blocks[0])
    assert "lint-imports && mkdocs build --strict" in command and "&& python -m pytest" in command
    assert _test_command((REPO / ".ci" / "run").read_text()) == command
    assert code_blocks(page("getting-started.md"))[0] == blocks[0]


def test_every_sub_command_and_flag_is_in_the_command_table():
    """Getting started's table lists each leaf of the ``secure-fed`` parser with exactly its flags."""
    import argparse

    from secure_fed.cli import build_parser

    def commands(parser, prefix=()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, (*prefix, name))
                return
        flags = {a.option_strings[-1] for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)}
        yield " ".join(prefix), flags

    rows = dict(re.findall(r"^\| `([a-z][a-z -]*)`(?: \([^)]*\))? \| (.*) \|$", page("getting-started.md"), flags=re.M))
    for command, flags in commands(build_parser()):
        assert command in rows, f"Getting started's command table has no row for `{command}`"
        assert set(re.findall(r"--[a-z-]+", rows[command])) == flags, command
