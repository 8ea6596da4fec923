"""Hand-made run directories for the report tests: the released files a run leaves (``config.yaml``,
``metrics.jsonl``, ``summary.json``) and, with ``auc``, an audit's ``private/attacks.json``; no training."""

from __future__ import annotations

import json
import math
from pathlib import Path

import yaml


def fake_run(root: Path, name: str, *, eps: float = math.inf, seed: int = 0, rounds: int = 4, method: str = "fedaws",
             lam: float = 10.0, clip: float = 1.0, auc: float | None = None, p1: float = 50.0) -> Path:  # fmt: skip
    """A finished run at target ``eps`` (∞: no dp layer) with P@1 rising to ``p1``."""
    run = root / name
    (run / "private").mkdir(parents=True)
    dp = math.isfinite(eps)
    local = {"target_epsilon": eps, "noise_multiplier": None, "clip_norm": clip, "batch_sample_rate": 0.5} if dp else None
    cfg = {
        "seed": seed, "device": "cpu", "output": {"dir": str(root), "name": name},
        "algorithm": {"name": method, "lam": lam}, "training": {"rounds": rounds, "executor": "sequential"},
        "protocols": ["dp"] if dp else [],
        "privacy": {"delta": 1e-5, "accountant": "rdp", "noise_seed": None, "instance": None, "local": local, "client": None},
    }  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    spent = eps * 0.9995 if dp else "inf"
    priv = (
        {"epsilon": spent, "delta": 1e-5, "unit": "instance",
         "units": {"instance": {"epsilon": spent, "delta": 1e-5, "accountant": "rdp", "noise_multiplier": 1.25,
                                "target_epsilon": eps, "adversaries": {"observer": {"epsilon": spent},
                                                                       "server": {"epsilon": "inf"}}}}}
        if dp else {"epsilon": "inf", "delta": None, "note": "no differential privacy mechanism in this run"}
    )  # fmt: skip
    lines = [{"round": r, "P@1": p1 * r / rounds, "P@3": p1 * r / rounds / 2, "mAP": p1 * r / rounds * 0.8,
              "W_mean_cos": 0.01 * r, "privacy": {k: v for k, v in priv.items() if k != "units"}}
             for r in range(2, rounds + 1, 2)]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    final = {k: v for k, v in lines[-1].items() if k not in ("round", "privacy", "W_mean_cos")}
    summary = {"algorithm": method, "status": "completed", "rounds_completed": rounds, "final": final,
               "W_mean_cos": lines[-1]["W_mean_cos"], "privacy": priv}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    if auc is not None:
        res = {"metrics": {"loss": {"auc": auc, "auc_ci95": [auc - 0.04, auc + 0.05]}}, "chance": {"loss": {"auc": 0.5}}}
        (run / "private" / "attacks.json").write_text(json.dumps({"attacks": {"membership_inference": res}}))
    return run
