"""``secure-fed audit``: a sub-command this package adds to the CLI (``secure_fed.commands`` entry point)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from secure_fed.plugin_api.attacks import SecureFedError, attack_specs, attacks_path, check_writable_dir, unknown_name


def parse_bugs(text: str) -> tuple[str, ...]:
    """``--bugs``: comma-separated planted bugs, ``all``, or ``none`` (the control only)."""
    from threat_models.self_test import BUGS

    names = [b.strip() for b in text.split(",") if b.strip()]
    if names == ["all"]:
        return BUGS
    if names == ["none"]:
        return ()
    if not names:
        raise SecureFedError(f"--bugs {text!r}: name at least one planted bug, all, or none")
    if bad := [b for b in names if b not in BUGS]:
        raise SecureFedError("--bugs: " + unknown_name("planted bug", bad[0], dict.fromkeys(BUGS)))
    return tuple(names)


def cmd_self_test(args: argparse.Namespace) -> int:
    """``secure-fed audit --self-test``: the control and each planted bug, audited; a table; exit 1 if a bug is not
    caught or the control is flagged (:mod:`threat_models.self_test`)."""
    if args.run_dir is not None or args.attacks is not None or args.overrides:
        raise SecureFedError("--self-test trains its own runs: give no run directory, no --attacks and no --set")
    if args.control_runs < 0:
        raise SecureFedError(f"--control-runs {args.control_runs}: 0 or more")
    if not (0.0 < args.epsilon < math.inf):
        raise SecureFedError(f"--epsilon {args.epsilon}: a positive, finite ε")
    bugs = parse_bugs(args.bugs)
    from threat_models import self_test

    print(f"self-test of the one-run audit: claimed ε = {args.epsilon:g}, {args.control_runs} control run(s) and "
          f"{len(bugs)} planted bug(s), each audited with {self_test.RECIPE_CANARIES} canaries "
          "(noise-free replay reference)")  # fmt: skip
    print(self_test.HEADER, flush=True)
    results = self_test.self_test(
        bugs, control_runs=args.control_runs, seed=args.seed, epsilon=args.epsilon,
        on_result=lambda r: print(self_test.table_row(r), flush=True),
    )  # fmt: skip
    failed = [r for r in results if not r.ok]
    conf = results[0].confidence if results else 0.95
    if failed:
        print(f"FAIL: {len(failed)} of {len(results)} (a bug not caught or the control flagged, at {conf:.0%} confidence)")
        return 1
    print(f"ok: every planted bug caught, the control never flagged (lower bounds at {conf:.0%} confidence)")
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    if args.self_test:
        return cmd_self_test(args)
    if args.run_dir is None:
        raise SecureFedError("give a run directory to audit (or --self-test)")
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
    overrides = audit_overrides(args.overrides)
    from secure_fed.config import load_plan
    from threat_models.attacks_section import attacks_of
    from threat_models.audit_cost import estimate

    plan = load_plan(run_dir / "config.yaml", overrides)  # a bad --set: its error line before anything runs
    chosen = names or attacks_of(plan).names() or list(specs)
    print(estimate(run_dir, plan, chosen)[0], flush=True)  # the cost first, before torch is imported
    from threat_models.audit import audit_run_dir, skipped_attacks
    from threat_models.verdict import verdict_lines

    try:
        doc = audit_run_dir(run_dir, names, data_root=args.data_root, overrides=overrides)
    except FileNotFoundError as exc:
        raise SecureFedError(str(exc)) from exc
    print(f"wrote {attacks_path(run_dir)} (operator-only: computed from the members; do not release it)")
    if args.attacks is not None and args.attacks.strip() != "all":  # attacks named one by one: each must have run
        if skipped := skipped_attacks(doc, names):
            name, why = next(iter(skipped.items()))
            more = f" (and {len(skipped) - 1} more: {', '.join(list(skipped)[1:])})" if len(skipped) > 1 else ""
            raise SecureFedError(f"--attacks {name}: skipped: {why}{more}")
    attacks = doc.get("attacks", {})
    lines = verdict_lines(attacks, [n for n in chosen if n in attacks])
    if lines:
        print("verdict:")
        print("\n".join(f"  {line}" for line in lines))
    return 0


def audit_overrides(items: list[str]) -> list[str]:
    """``audit --set``: ``attacks.*`` settings only (the run's other settings are what it trained with); the syntax
    is run's (:func:`secure_fed.config.check_override_syntax`)."""
    from secure_fed.config import check_override_syntax

    check_override_syntax(items)
    for item in items:
        key = item.split("=", 1)[0].strip()
        if not key.startswith("attacks.") or key == "attacks.run":
            raise SecureFedError(
                f"--set {item}: an audit changes attacks.* settings only (the run's other settings are what it "
                "trained with; choose attacks with --attacks)"
            )
    return items


def register(sub) -> None:
    p = sub.add_parser("audit", help="run attacks (threat_models) on a finished run; writes RUN_DIR/private/attacks.json")
    p.add_argument("run_dir", nargs="?", default=None, help="a finished run directory")
    p.add_argument(
        "--attacks", default=None, help="comma-separated attack names or 'all' (default: the run's attacks.run, else all)"
    )
    p.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="an attacks.NAME.KEY setting of an attack for this audit (repeatable; the keys: "
                        "secure-fed list and the config reference)")  # fmt: skip
    g = p.add_argument_group("self-test (no run directory): planted mechanism bugs the one-run audit must catch")
    g.add_argument("--self-test", action="store_true",
                   help="train a small private recipe with each planted bug and the correct mechanism (the control); "
                        "print bug, claimed ε, lower bound, caught; exit 1 if a bug is not caught or the control is "
                        "flagged")  # fmt: skip
    g.add_argument("--bugs", default="all", help="comma-separated planted bugs, all (default) or none")
    g.add_argument(
        "--control-runs", type=int, default=3, help="runs of the correct mechanism, seeds SEED, SEED+1, ... (default 3)"
    )
    g.add_argument("--epsilon", type=float, default=1.0, help="the claimed (configured) ε of every run (default 1)")
    g.add_argument("--seed", type=int, default=0, help="the first run seed (default 0)")
    p.set_defaults(func=cmd_audit)
