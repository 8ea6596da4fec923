"""Golden runs: figures recorded before the engine redesign, which the redesign must reproduce.

``python -m tests.engine.golden --write`` records them (into ``golden_runs.json`` beside this file);
``tests/engine/test_golden_runs.py`` re-runs each case and compares. Recorded on CPU after the
privacy-correctness fixes, from the commit named in the JSON.

Every case is bit-identical (metrics, ε and the SHA-256 of θ and W), except where a layer draws fresh
keys by design: keyed hashing's run key (pinned here, since it decides W's row order) and CKKS, whose
fresh encryption noise makes sums equal only to CKKS precision; its case is compared with tolerances.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_runs.json"
CPU = ["device=cpu", "output.progress=false", "training.precision=fp32"]  # recorded in fp32, on any CPU
DP = ["algorithm.normalize_gamma=false", 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}',
      'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}', "privacy.noise_seed=7"]  # fmt: skip

#: name → (config file relative to the repo or None for the embedded default, overrides, exact?)
CASES: dict[str, tuple[str | None, list[str], bool]] = {
    "default": (None, CPU, True),
    "bibtex_fedalc_5_rounds": ("experiments/configs/bibtex_fedalc.yaml", [*CPU, "training.rounds=5", "evaluation.every=5"], True),
    "default_keyed_dp_secagg": (
        None,
        [*CPU, "training.rounds=10", 'protocols=["keyed_hashing", "dp", "secure_aggregation"]', *DP],
        True,
    ),
    "default_dp_ckks": (None, [*CPU, "training.rounds=4", "evaluation.every=2", 'protocols=["dp", "ckks"]', *DP], False),
}


@contextlib.contextmanager
def pinned_run_key():
    """Keyed hashing draws its run key and salt from os.urandom by design; pin them for a comparable run."""
    import protocols.keyed_hashing as kh

    counter = iter(range(10**6))
    real = kh.os.urandom

    class _OS:
        def __getattr__(self, name):
            return getattr(os, name)

        @staticmethod
        def urandom(n: int) -> bytes:
            return hashlib.shake_256(f"golden {next(counter)}".encode()).digest(n)

    kh.os = _OS()
    try:
        yield
    finally:
        kh.os = os
        assert os.urandom is real


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


#: torch threads the figures were recorded with: a matrix product splits its sums by thread, so the last bits of θ
#: and W (and their SHA-256) depend on the count; every case runs with it, whatever the machine or test runner set
RECORDED_THREADS = 1


@contextlib.contextmanager
def recorded_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(RECORDED_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_case(name: str, tmp: Path, data_root: str | None) -> dict[str, Any]:
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    path, overrides, _ = CASES[name]
    repo = HERE.parents[1]
    cfg = load_config(repo / path if path else None, overrides)
    with pinned_run_key(), recorded_threads():
        exp = Experiment(cfg, run_dir=tmp / name, data_root=data_root)
        res = exp.run(progress=False)
    lines = [json.loads(x) for x in (tmp / name / "metrics.jsonl").read_text().splitlines()]
    for x in lines:
        x.pop("wall_seconds", None)
    return {
        "final": res.summary["final"],
        "privacy": res.summary["privacy"],
        "metrics": lines,
        "theta": {n: _digest(t) for n, t in exp.theta.items()},
        "W": _digest(exp.W),
        "theta_norms": {n: float(t.double().norm()) for n, t in exp.theta.items()},
        "W_norm_of_difference_from_init": float((exp.W.double() - _initial_W(exp).double()).norm()),
    }


def _initial_W(exp) -> torch.Tensor:
    from secure_fed.models import spread_init

    gen = torch.Generator().manual_seed(exp.cfg.seed * 104729 + 1)
    return spread_init(exp.dataset.num_labels, exp.cfg.model.embedding_dim, generator=gen)


def close(a: Any, b: Any, *, rel: float, abs_: float) -> bool:
    """Nested equality with numeric tolerance (for the CKKS case)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rel=rel, abs_=abs_) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rel=rel, abs_=abs_) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return bool(np.isclose(a, b, rtol=rel, atol=abs_))
    return a == b


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--data-root", default=os.environ.get("SECURE_FED_DATA"))
    ap.add_argument("--cases", default=None, help="comma-separated case names to record again (default: all)")
    ap.add_argument("--why", default=None, help="with --cases: the reason, appended to the JSON's `rerecorded` field")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    names = list(CASES) if args.cases is None else args.cases.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        cases = {n: run_case(n, Path(tmp), args.data_root) for n in names}
    out = {"commit": commit, "cases": cases}
    if args.cases is not None:  # the other cases stay as recorded; the note says which were recorded again and why
        old = json.loads(GOLDEN.read_text())
        out = {**old, "cases": {**old["cases"], **cases}}
        out["rerecorded"] = [*old.get("rerecorded", []), f"{', '.join(names)} (after {commit[:7]}): {args.why or '?'}"]
    if args.write:
        GOLDEN.write_text(json.dumps(out, indent=1, sort_keys=True))
        print(f"wrote {GOLDEN}")
    else:
        print(json.dumps(out, indent=1)[:2000])


if __name__ == "__main__":
    main()
