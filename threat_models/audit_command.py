"""``secure-fed audit``: a sub-command this package adds to the CLI (``secure_fed.commands`` entry point)."""

from __future__ import annotations

import argparse
from pathlib import Path

from secure_fed.errors import SecureFedError, unknown_name
from secure_fed.io import check_writable_dir
from secure_fed.plugin_specs import attack_specs
from secure_fed.run_files import attacks_path


def cmd_audit(args: argparse.Namespace) -> int:
    specs = attack_specs()
    names = None
    if args.attacks is not None:
        names = [a.strip() for a in args.attacks.split(",") if a.strip()]
        if not names:
            raise SecureFedError(f"--attacks {args.attacks!r}: name at least one attack, or all")
        names = list(specs) if names == ["all"] else names
        bad = [a for a in names if a not in specs]
        if bad:
            raise SecureFedError("--attacks: " + unknown_name("attack", bad[0], specs))
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise SecureFedError(f"{run_dir} is not a run directory (no config.yaml)")
    check_writable_dir(attacks_path(run_dir).parent, what="run directory's private/")  # refused before any attack runs
    from threat_models.audit import audit_run_dir, skipped_attacks

    print(f"auditing {run_dir}")
    try:
        doc = audit_run_dir(run_dir, names, data_root=args.data_root)
    except FileNotFoundError as exc:
        raise SecureFedError(str(exc)) from exc
    print(f"wrote {attacks_path(run_dir)} (operator-only: computed from the members; do not release it)")
    if args.attacks is not None and args.attacks.strip() != "all":  # attacks named one by one: each must have run
        if skipped := skipped_attacks(doc, names):
            name, why = next(iter(skipped.items()))
            more = f" (and {len(skipped) - 1} more: {', '.join(list(skipped)[1:])})" if len(skipped) > 1 else ""
            raise SecureFedError(f"--attacks {name}: skipped: {why}{more}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("audit", help="run attacks (threat_models) on a finished run; writes RUN_DIR/private/attacks.json")
    p.add_argument("run_dir", help="a finished run directory")
    p.add_argument(
        "--attacks", default=None, help="comma-separated attack names or 'all' (default: the run's attacks.run, else all)"
    )
    p.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")
    p.set_defaults(func=cmd_audit)
