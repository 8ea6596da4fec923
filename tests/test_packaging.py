"""The wheel: built from the tracked files, installed into a clean virtual environment, it brings the package, its
entry points (layers, attacks, algorithms, the ``secure-fed`` command) and its default config, and reports the
version of ``pyproject.toml`` (one source: the installed metadata).

The environment is clean of this checkout: no system site directory is processed (so the editable install's import
hook is not), the wheel is installed with ``--no-deps``, and the heavy dependencies (torch, pydantic, ...) are made
importable by a plain path entry to this interpreter's site-packages; commands run from an empty directory."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, tracked):
        path = REPO / name.decode()
        if path.is_file():
            (src / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name.decode())
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist)], check=True, capture_output=True)  # fmt: skip
    (wheel,) = dist.glob("secure_fed-*.whl")
    env_dir = tmp / "venv"
    # the venv's own pip (ensurepip, offline) installs the wheel: pip run from this interpreter with --python hands the
    # install to the target only when its environment lacks _PIP_RUNNING_IN_SUBPROCESS, and a misplaced install would
    # leave the venv without the package
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "_PIP_", "PYTHON"))}
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, env=clean).stdout.strip())  # fmt: skip
    pip = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], capture_output=True,
                         text=True, env=clean)  # fmt: skip
    assert pip.returncode == 0 and (site / "secure_fed" / "__init__.py").is_file(), (pip.stdout, pip.stderr)
    # the dependencies, as a plain path (its .pth files, among them the editable install's hook, are not processed)
    (site / "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env_dir


def _run(env_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(env_dir / "bin" / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={"PATH": str(env_dir / "bin"), "HOME": str(cwd)})  # fmt: skip


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    out = _run(installed, "python", "-c", "import secure_fed, protocols, threat_models; print(secure_fed.__file__)",
               cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(installed), out.stdout


def test_the_command_reports_the_pyproject_version(installed, tmp_path):
    version = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    out = _run(installed, "secure-fed", "--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert version in out.stdout


def test_entry_points_and_the_default_config_come_with_the_wheel(installed, tmp_path):
    listing = _run(installed, "secure-fed", "list", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    for name in (
        "dp",
        "secure_aggregation",
        "ckks",
        "keyed_hashing",
        "membership_inference",
        "data_size_ranking",
        "fedalc",
        "flag",
    ):
        assert name in listing.stdout, name
    # an attack's own section, read from its spec's settings through the wheel's entry points
    code = "import secure_fed.config as c; print(c.load_config(None, ['attacks.data_size_ranking.parameters=all']).attacks)"
    section = _run(installed, "python", "-c", code, cwd=tmp_path)
    assert section.returncode == 0 and "data_size_ranking=DataSizeRankingConfig(parameters='all'" in section.stdout, section
    # the embedded default, read from the wheel's package data
    code = "import secure_fed.config as c; cfg = c.load_config(None); print(cfg.algorithm.name, len(c.default_config_text()))"
    default = _run(installed, "python", "-c", code, cwd=tmp_path)
    assert default.returncode == 0, default.stderr
    name, size = default.stdout.split()
    assert name and int(size) > 0
    assert list(tmp_path.iterdir()) == [], "reading the default wrote files"
