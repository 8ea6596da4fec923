"""What the example plugins' tests share: a small run under the plugins, an update's norm, the CLI in a subprocess."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from secure_fed.models.sparse_rows import dense_delta
from tests.conftest import small_config
from tests.examples.conftest import REPO

#: client-level DP with the server's noise: the wire updates are the clipped plaintext ones (log_messages shows them)
CLIENT_DP = 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}'


def run(tmp_path, *overrides: str):
    """Two rounds of the small synthetic default under ``overrides``, the messages kept."""
    cfg = small_config("training.rounds=2", "evaluation.every=1", "output.log_messages=true", *overrides)
    return Experiment(build_plan(cfg), run_dir=tmp_path).run(progress=False)


def update_parts(reply: dict) -> list:
    """The tensors of a client update: Δθ (dense) and its row deltas."""
    return [dense_delta(t) for t in reply["theta_delta"].values()] + ([reply["rows_delta"]] if "rows_delta" in reply else [])


def norm(reply: dict) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in update_parts(reply)))


def uplinks(result) -> list[dict]:
    """The clients' plaintext updates as the server received them."""
    return [m["message"] for m in result.messages if m["direction"] == "up" and "theta_delta" in m["message"]]


#: a fresh process's runs (argv: run directory, then a JSON list of override lists): each run's summary and, for each
#: plaintext update the server received, its (nonzero entries, entries, L2 norm)
CHILD = """
import json, sys
from pathlib import Path
from tests.examples.helpers import norm, run, update_parts, uplinks
out = []
for i, overrides in enumerate(json.loads(sys.argv[2])):
    result = run(Path(sys.argv[1]) / str(i), *overrides)
    sent = [(sum(int((t != 0).sum()) for t in update_parts(u)), sum(t.numel() for t in update_parts(u)), norm(u))
            for u in uplinks(result)]
    out.append({"summary": result.summary, "sent": sent})
print(json.dumps(out, default=str))
"""


def _env(path_entries: list[str]) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *path_entries])}


def run_fresh(path_entries: list[str], run_dir: Path, *runs: list[str]) -> list[dict]:
    """:func:`run` of each override list in a fresh process with the plugins on its path, as an installed plugin
    runs: the engine binds the algorithm classes when it is first imported (``secure_fed.engine.builders``), so an
    algorithm registered later in a process that has imported it is not found there."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), json.dumps(list(runs))],
        cwd=REPO, env=_env(path_entries), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def validate(path_entries: list[str], *overrides: str) -> tuple[int, str]:
    """``secure-fed validate`` of the default config with ``--set`` overrides, in a subprocess whose PYTHONPATH holds
    the plugins; returns (exit status, stderr)."""
    sets = [a for o in overrides for a in ("--set", o)]
    default = REPO / "secure_fed" / "config" / "default.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "secure_fed.cli", "validate", str(default), *sets],
        cwd=REPO, env=_env(path_entries), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stderr
