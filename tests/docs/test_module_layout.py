"""The Layout page is generated from the code (docs/hooks/module_layout.py): every module of the three packages is
listed with its docstring's first sentence, and a module without a docstring stops the build."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("module_layout", REPO / "docs" / "hooks" / "module_layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)


def test_every_module_is_listed_with_its_first_sentence():
    page = layout.render()
    for package in layout.PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if path.name != "__init__.py" or path.read_text().lstrip().startswith(('"""', "'''")):
                assert f"`{path.relative_to(REPO).as_posix()}`" in page, path
    assert "| `secure_fed/engine/runner.py` | The round engine" in page


def test_a_module_without_a_docstring_stops_the_build(tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "good.py").write_text('"""Holds the good part. More."""\n')
    (tmp_path / "pkg" / "bare.py").write_text("x = 1\n")
    monkeypatch.setattr(layout, "REPO", tmp_path)
    monkeypatch.setattr(layout, "PACKAGES", ("pkg",))
    with pytest.raises(ValueError, match="pkg/bare.py"):
        layout.render()
    (tmp_path / "pkg" / "bare.py").unlink()
    assert "| `pkg/good.py` | Holds the good part. |" in layout.render()


def test_the_layout_page_holds_the_marker():
    assert layout.MARKER in (REPO / "docs" / "layout.md").read_text()
