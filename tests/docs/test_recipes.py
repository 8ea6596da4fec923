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


def test_the_python_block_loads_an_exported_model(tmp_path, monkeypatch, capsys):
    """The recipes' Python block (loading ``secure-fed export``'s file) runs on a freshly exported model: θ loads into
    the encoder it rebuilds (strictly), and it prints the released ε and a ranking of the model's labels."""
    import re

    import torch

    from secure_fed.cli import main
    from tests.conftest import SMALL

    (block,) = [b for b in re.findall(r"^```python\n(.*?)^```", page("recipes.md"), flags=re.S | re.M) if "export" in b
                or "torch.load" in b]  # fmt: skip
    run, model = tmp_path / "run", tmp_path / "model.pt"
    from tests.test_privacy_lines import COVERED

    sets = [*SMALL, "training.rounds=2", "model.name=sparse_text", "model.hidden_dims=[]", *COVERED,
            "evaluation.remove_shared_direction=true"]  # fmt: skip
    assert main(["run", "--out", str(run), *[x for s in sets for x in ("--set", s)]]) == 0
    assert main(["export", str(run), "--out", str(model)]) == 0
    capsys.readouterr()
    assert '"runs/first-dp.pt"' in block
    exec(compile(block.replace('"runs/first-dp.pt"', repr(str(model))), "recipes.md", "exec"), {})  # noqa: S102
    out = capsys.readouterr().out
    doc = torch.load(model, weights_only=True)
    assert f"released model: ε = {doc['privacy']['epsilon']}, δ = 1e-05" in out and doc["privacy"]["epsilon"] != "inf"
    top = re.search(r"top 5 labels: \[([\d, ]+)\]", out).group(1).split(", ")
    assert len(top) == 5 and all(0 <= int(i) < doc["W"].shape[0] for i in top)


def test_the_attacks_list_of_a_set_is_quoted_in_every_page():
    """``--set attacks.run=[all]`` unquoted is a glob to zsh ("no matches found"): the docs and the README quote it."""
    import re

    pages = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
    bare = [
        f"{p.relative_to(REPO)}: {m.group(0)}" for p in pages for m in re.finditer(r"--set attacks\.run=\[[^\s]*", p.read_text())
    ]
    assert not bare, bare
