"""The example plugins (``examples/plugins/``) registered without installing them: a temporary ``*.dist-info``
directory per package, whose ``entry_points.txt`` is read from the package's own ``pyproject.toml``, on the path
with the package's directory, as ``pip install`` would leave them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomllib

from secure_fed import plugins
from secure_fed.config import schema

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "examples" / "plugins"
PACKAGES = ("clipping_layer", "topk_fedavg", "fedprox", "scaffold", "moon")


def write_dist_info(where: Path, package: str) -> None:
    """``where/<package>-<version>.dist-info`` with the METADATA and entry points of the package's pyproject.toml."""
    project = tomllib.loads((PLUGINS / package / "pyproject.toml").read_text())["project"]
    info = where / f"{package}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "\n".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for g, eps in groups.items())
    )


def _clear_caches() -> None:
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()


@pytest.fixture
def plugin_path(tmp_path, monkeypatch) -> list[str]:
    """The example packages registered in this process; returns the path entries (for a subprocess's PYTHONPATH)."""
    dists = tmp_path / "site"
    for package in PACKAGES:
        write_dist_info(dists, package)
    entries = [str(dists), *(str(PLUGINS / p) for p in PACKAGES)]
    for entry in reversed(entries):
        monkeypatch.syspath_prepend(entry)
    _clear_caches()
    yield entries
    _clear_caches()
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        del sys.modules[name]
