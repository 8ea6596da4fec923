"""The ``secure-fed`` command line.

    secure-fed run [CONFIG] [--set key.path=value ...] [--data-root DIR] [--out DIR]
    secure-fed resume RUN_DIR            (same as: secure-fed run --resume RUN_DIR)
    secure-fed sweep [CONFIG] --grid key=v1,v2 [--grid ...] [--seeds 0,1,2] [--out DIR]
    secure-fed report RUN_DIR [RUN_DIR ...] [--out FILE.png]
    secure-fed validate CONFIG [--set ...]
    secure-fed audit RUN_DIR [--attacks a,b] [--data-root DIR]
    secure-fed list
    secure-fed data download NAME [--root DIR] [--mirror URL]

User mistakes (bad config, missing file) print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

from secure_fed.errors import SecureFedError, unknown_name


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set training.rounds=10 (repeatable)",
    )
    p.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")


def _run_dir_for(cfg, out: str | None) -> Path:
    if out:
        return Path(out)
    name = cfg.output.name or f"{cfg.algorithm.name}-{cfg.dataset.name or 'data'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.output.dir) / name


def _print_summary(summary: dict, run_dir: Path) -> None:
    final = summary["final"]
    metrics = "  ".join(f"{k} {final[k]:.2f}" for k in ("P@1", "P@3", "P@5", "mAP") if k in final)
    eps = summary["privacy"]["epsilon"]
    print(
        f"{summary['algorithm']} on {summary['dataset']}: {summary['rounds_completed']} rounds "
        f"in {summary['wall_seconds']:.1f}s ({summary['seconds_per_round']:.2f}s/round) [{summary['status']}]"
    )
    print(f"  {metrics}  mean cos(W) {summary['W_mean_cos']:.3f}  privacy: ε = {eps}")
    print(f"  run directory: {run_dir} (private/ holds the operator's diagnostics: do not release it)")
    if "warning" in summary["privacy"]:
        print(f"  warning: {summary['privacy']['warning']}")


def cmd_run(args: argparse.Namespace) -> int:
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    if args.resume:
        run_dir = Path(args.resume)
        if not (run_dir / "config.yaml").is_file():
            raise SecureFedError(f"cannot resume: {run_dir / 'config.yaml'} not found")
        if args.config:
            raise SecureFedError("give either CONFIG or --resume RUN_DIR, not both")
        cfg = load_config(run_dir / "config.yaml", args.overrides)
    else:
        cfg = load_config(args.config, args.overrides)
        run_dir = _run_dir_for(cfg, args.out)
        if (run_dir / "checkpoints" / "last.pt").exists():
            raise SecureFedError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
    exp = Experiment(cfg, run_dir=run_dir, data_root=args.data_root)
    print(exp.dataset.describe())
    if args.resume:
        if exp.resume():
            print(f"resuming {run_dir} from round {exp.round}")
        else:
            print(f"no checkpoint in {run_dir}; starting from round 0")
    result = exp.run()
    _print_summary(result.summary, run_dir)
    if cfg.attacks.names() and result.summary["status"] in ("completed", "budget_exhausted"):
        from threat_models.audit import audit
        from threat_models.context import AuditContext

        print(f"attacks ({', '.join(cfg.attacks.names())}):")
        audit(AuditContext(exp))
        print(f"  wrote {run_dir / 'attacks.json'}")
    return 0 if result.summary["status"] in ("completed", "budget_exhausted") else 130


def cmd_audit(args: argparse.Namespace) -> int:
    from threat_models import ATTACKS
    from threat_models.audit import audit_run_dir

    names = None
    if args.attacks:
        names = [a for a in args.attacks.split(",") if a]
        names = list(ATTACKS) if names == ["all"] else names
        bad = [a for a in names if a not in ATTACKS]
        if bad:
            raise SecureFedError("--attacks: " + unknown_name("attack", bad[0], ATTACKS))
    run_dir = Path(args.run_dir)
    print(f"auditing {run_dir}")
    try:
        audit_run_dir(run_dir, names, data_root=args.data_root)
    except FileNotFoundError as exc:
        raise SecureFedError(str(exc)) from exc
    print(f"wrote {run_dir / 'attacks.json'}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    args.resume, args.config, args.out = args.run_dir, None, None
    return cmd_run(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from secure_fed.config import load_config

    cfg = load_config(args.config, args.overrides)
    print(f"{args.config}: valid ({cfg.algorithm.name} on {cfg.dataset.name or cfg.dataset.train}, {cfg.training.rounds} rounds)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from protocols import LAYERS
    from secure_fed.algorithms import ALGORITHMS
    from secure_fed.data import PARTITIONERS, REGISTRY
    from secure_fed.models import MODELS
    from threat_models import ATTACKS

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        print(f"{title}:")
        if not rows:
            print("  (none available yet)")
        for name, desc in rows:
            print(f"  {name:<14} {desc}")

    section("algorithms", [(n, c.description) for n, c in ALGORITHMS.items()])
    section(
        "datasets",
        [(n, d.description) for n, d in REGISTRY.items()]
        + [("synthetic", "generated multi-label data with controllable label co-occurrence")],
    )
    section("partitioners", [(n, c.description) for n, c in PARTITIONERS.items()])
    section("models", list(MODELS.items()))
    section("protocols", [(n, getattr(c, "threat_model", "")) for n, c in LAYERS.items()])
    print("attacks:")
    for n, c in ATTACKS.items():
        print(f"  {n:<25} [{c.role.value}] {c.description}")
        print(f"  {'':<25} needs: {c.needs}")
        print(f"  {'':<25} defended by: {c.defended_by}")
    return 0


def cmd_data_download(args: argparse.Namespace) -> int:
    from secure_fed.data.download import download

    for path in download(args.name, args.root, mirror=args.mirror, force=args.force):
        print(f"ok  {path}")
    return 0


def _parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    grid = []
    for item in items:
        if "=" not in item:
            raise SecureFedError(f"--grid {item!r}: expected key.path=v1,v2,...")
        key, vals = item.split("=", 1)
        grid.append((key, [v for v in vals.split(",") if v != ""]))
    return grid


def cmd_sweep(args: argparse.Namespace) -> int:
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    grid = _parse_grid(args.grid)
    seeds = [int(s) for s in args.seeds.split(",")]
    base = load_config(args.config, args.overrides)
    out = Path(args.out or Path(base.output.dir) / f"sweep-{base.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    combos = list(itertools.product(*[[(k, v) for v in vs] for k, vs in grid])) or [()]
    rows = []
    for combo in combos:
        for seed in seeds:
            ov = list(args.overrides) + [f"{k}={v}" for k, v in combo] + [f"seed={seed}"]
            cfg = load_config(args.config, ov)  # validate every point before it runs
            tag = "-".join(f"{k.split('.')[-1]}{v}" for k, v in combo) or "base"
            run_dir = out / f"{tag}-seed{seed}"
            done = run_dir / "summary.json"
            if done.is_file() and json.loads(done.read_text()).get("status") == "completed":
                summary = json.loads(done.read_text())
            else:
                exp = Experiment(cfg, run_dir=run_dir, data_root=args.data_root)
                exp.resume()
                summary = exp.run().summary
            rows.append({"point": dict(combo), "seed": seed, "final": summary["final"], "run_dir": str(run_dir)})
            print(f"{tag} seed {seed}: P@1 {summary['final'].get('P@1', float('nan')):.2f}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {out / 'sweep.json'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from secure_fed.report import report

    path = report([Path(d) for d in args.run_dirs], out=Path(args.out) if args.out else None)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="secure-fed", description="Privacy-hardened federated learning with positive labels.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run an experiment (the embedded default when CONFIG is omitted)")
    p.add_argument("config", nargs="?", default=None)
    _add_run_args(p)
    p.add_argument("--out", default=None, help="run directory (default: output.dir/ALGO-DATASET-TIMESTAMP)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a run from its last checkpoint")
    p.add_argument("run_dir")
    _add_run_args(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("sweep", help="run a grid of overrides over seeds")
    p.add_argument("config", nargs="?", default=None, help="config file (default: the embedded default)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2", help="a swept key (repeatable)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--out", default=None)
    _add_run_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="plot metrics of one or more runs")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--out", default=None, help="PNG path (default: report.png in the first run directory)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("validate", help="check a config without running it")
    p.add_argument("config")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("audit", help="run attacks (threat_models) on a finished run; writes RUN_DIR/attacks.json")
    p.add_argument("run_dir")
    p.add_argument(
        "--attacks", default=None, help="comma-separated attack names or 'all' (default: the run's attacks.run, else all)"
    )
    p.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("list", help="list algorithms, datasets, partitioners, protocols and attacks")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("data", help="dataset utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    d = dsub.add_parser("download", help="fetch a Mulan dataset and verify its SHA-256")
    d.add_argument("name")
    d.add_argument("--root", default=None, help="data root (default: $SECURE_FED_DATA or ~/.cache/secure-fed/data)")
    d.add_argument("--mirror", default=None, help="base URL replacing the Mulan GitHub raw URL (file:// works)")
    d.add_argument("--force", action="store_true", help="download even if a verified copy exists")
    d.set_defaults(func=cmd_data_download)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SecureFedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
