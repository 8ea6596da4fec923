"""One experiment on Flower's simulation engine and in process, compared: θ, W, the final metrics and ε.

    python benchmarks/flower_parity.py [CONFIG] [--set KEY=VALUE ...] [--json FILE]

The Flower run goes first, with the project's ClientApp plus an instrument that reads back what the nodes hold
(``tests/engine/flower/nodes.py``): with keyed hashing its run key and salt, which the dealer node drew. The
in-process run then pins its dealer to that key (keyed hashing draws it from ``os.urandom`` by design), so both runs
see the same pseudonyms and row order; DP noise follows ``privacy.noise_seed``, which the comparison needs set.
In process runs at one torch thread, as each Flower node does. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", nargs="?", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", default=None, help="write the figures to this file")
    args = ap.parse_args(argv)

    import torch

    from secure_fed.config import load_config
    from secure_fed.engine import Experiment
    from secure_fed.engine.flower.simulation import run_on_flower
    from tests.engine.flower.nodes import pinned_run_key, recording_app

    out = Path(tempfile.mkdtemp(prefix="flower-parity-"))
    nodes = out / "nodes"
    nodes.mkdir()
    cfg = load_config(args.config, [*args.overrides, "backend=flower"])
    t0 = time.perf_counter()
    fl = Experiment(cfg, run_dir=out / "flower")
    flower = run_on_flower(fl, progress=False, client_app=recording_app(cfg, nodes))
    t_flower = time.perf_counter() - t0
    rings = [json.loads(p.read_text()) for p in nodes.glob("[0-9]*.json")]
    keys = {(r["run_key"], r["salt"]) for r in rings if r.get("run_key")}
    if len(keys) > 1:
        raise SystemExit(f"the nodes hold {len(keys)} different run keys")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        local_exp = Experiment(load_config(args.config, args.overrides), run_dir=out / "local")
        if keys:
            run_key, salt = next(iter(keys))
            with pinned_run_key(bytes.fromhex(run_key), bytes.fromhex(salt)):
                local = local_exp.run(progress=False)
        else:
            local = local_exp.run(progress=False)
    finally:
        torch.set_num_threads(threads)
    t_local = time.perf_counter() - t0
    fig = {
        "config": args.config or "default",
        "overrides": args.overrides,
        "clients": len(fl.fed.clients),
        "rounds": flower.summary["rounds_completed"],
        "status": [flower.summary["status"], local.summary["status"]],
        "max_abs_theta_diff": max(float((fl.theta[n] - t).abs().max()) for n, t in local_exp.theta.items()),
        "max_abs_W_diff": float((fl.W - local_exp.W).abs().max()) if fl.W is not None else 0.0,
        "max_abs_metric_diff": max(abs(flower.summary["final"][k] - v) for k, v in local.summary["final"].items()),
        "privacy_equal": flower.summary["privacy"] == local.summary["privacy"],
        "epsilon": [flower.summary["privacy"]["epsilon"], local.summary["privacy"]["epsilon"]],
        "final_flower": flower.summary["final"],
        "messages": dict(fl.executor.sent),
        "seconds": {"flower": round(t_flower, 1), "inprocess": round(t_local, 1)},
    }
    print(json.dumps({k: v for k, v in fig.items() if k != "final_flower"}, indent=1))
    print("P@1 P@3 P@5 (flower):", [round(flower.summary["final"].get(k, float("nan")), 4) for k in ("P@1", "P@3", "P@5")])
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2))
    return fig


if __name__ == "__main__":
    main()
