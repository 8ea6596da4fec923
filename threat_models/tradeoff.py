"""``secure-fed tradeoff``: the privacy/utility study as one command.

    secure-fed tradeoff CONFIG --epsilons 0.5,1,2,4,8,inf --seeds 0,1,2 [--methods fedalc,fedaws]
                       [--attacks NAME,NAME] [--set key=value …] [--workers N] --out DIR

For every (method, ε, seed) it runs CONFIG with the method as ``algorithm.name``, the seed, and ε as the
target of the privacy unit the config's DP protects (the instance unit: ``privacy.instance`` and
``privacy.local``; or ``privacy.client`` with ``--unit client``), σ calibrated to it (a fixed
``noise_multiplier`` is dropped). ε = ``inf`` is the same run without the ``dp`` layer, or with ``--infinity
noiseless`` the same dp layer with noise multiplier 0 (its clip, bound and sampling, no noise). A method that has no
server step over label sets drops ``privacy.instance`` (its instance unit is client training alone).
The attacks run on each finished run (their canaries and taps are inserted during training).

Runs are cached and resumable (the sweep's cache: a finished run of the same config is skipped, an
interrupted one resumes), in a process pool sized to the machine. DIR receives ``runs/``,
``results.csv`` (one row per run), the PNG plots and ``report.html``: released facts and the utility only. The
attacks' results are computed from the members (each run's ``private/attacks.json``): with ``--attacks``, they
are in ``DIR/private/`` only: ``results.csv`` with every column, the attacks' ones named ``operator.…``, and
``report.html`` and the PNGs with the attack plots (operator-only, like a run's ``private/``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

from secure_fed.plugin_api.attacks import PRIVATE_DIR, SecureFedError, phase, unknown_name
from threat_models.tradeoff_points import (
    INFINITY_POINTS,
    _job,
    _label,
    central_reference_method,
    method_base,
    parse_epsilons,
    point_overrides,
    statistic_mechanism,
    statistic_methods,
    worker_pool,
)

#: what a study on a validation split says of its numbers
VALIDATION_NOTE = (
    "Metrics on a validation split of the training data (dataset.evaluate_on: validation): no DP "
    "mechanism covers them, so every run's released ε is ∞; the columns are the target ε of training."
)


def cmd_tradeoff(args: argparse.Namespace) -> int:
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import (
        ConfigError,
        attack_specs,
        cached_summary,
        check_writable_dir,
        parse_seeds,
        run_row,
    )

    if args.workers is not None and args.workers < 1:
        raise SecureFedError(f"--workers {args.workers}: give at least 1")
    check_selection_options(args)
    eps_list = parse_epsilons(args.epsilons)
    seeds = parse_seeds(args.seeds)
    methods = [m for m in (args.methods or "").split(",") if m]
    if not methods:
        methods = [load_plan(args.config, args.overrides).algorithm.name]
    if args.reference == "auto":
        extra, why = central_reference_method(args.config, args.overrides, methods, unit=args.unit)
        methods += extra
        print(f"tradeoff: {why}", flush=True)
    extra, why = prior_method(args, methods)
    methods += extra
    if why:
        print(f"tradeoff: {why}", flush=True)
    specs = attack_specs()
    attacks = [a for a in (args.attacks or "").split(",") if a]
    for a in attacks:
        if a not in specs:
            raise SecureFedError("--attacks: " + unknown_name("attack", a, specs))
    out = Path(args.out)
    check_writable_dir(out, what="--out")
    points = []  # validate every point (and every cached run's config) before anything runs
    for method in methods:
        base = method_base(args.config, args.overrides, method)
        for eps in eps_list:
            for seed in seeds:
                ov = [*args.overrides, *point_overrides(base, method=method, eps=eps, seed=seed, unit=args.unit,
                                                         attacks=attacks, infinity=args.infinity)]  # fmt: skip
                try:
                    plan = load_plan(args.config, ov)
                except ConfigError as exc:
                    raise SecureFedError(f"--methods {method} at ε = {_label(eps)}: {exc}") from None
                run_dir = out / "runs" / f"{method}-eps{_label(eps)}-seed{seed}"
                if any(pt[4] == run_dir for pt in points):
                    raise SecureFedError(
                        f"{method} at ε = {_label(eps)}, seed {seed} is listed twice (--methods, --epsilons, --seeds)"
                    )
                if args.select != "private":  # a selected run's config is its candidate's (checked by its selection)
                    cached_summary(plan, run_dir)
                points.append((method, eps, seed, ov, run_dir))
    workers = args.workers or max(1, min(len(points), (os.cpu_count() or 1)))
    threads = max(1, (os.cpu_count() or 1) // workers)
    print(f"tradeoff: {len(methods)} method(s) × {len(eps_list)} ε × {len(seeds)} seed(s) = {len(points)} runs, "
          f"{workers} worker(s) × {threads} thread(s) → {out}", flush=True)  # fmt: skip
    t0 = time.time()
    failed = []
    if args.select == "private":  # each point the best of K secret-drawn candidates, ε covering the selection
        from secure_fed.plugin_api.attacks import stamp_released
        from threat_models.private_selection import run_selection

        rows, runs, failed = run_selection(args, points, attacks=attacks, workers=workers, threads=threads, out=out)
        status = _write_study(args, out, methods, seeds, rows, runs, failed, len(points))
        stamp_released(out)  # when the study ended would tell the sum of the points' secret K
        return status
    with worker_pool(workers) as pool:
        futures = [(pt, pool.submit(_job, args.config, pt[3], str(pt[4]), args.data_root, attacks, threads)) for pt in points]
        with phase("tradeoff: runs", total=len(points)) as cells:  # after the submissions: the workers start first
            for i, ((method, eps, seed, _, run_dir), fut) in enumerate(futures, 1):
                try:
                    summary, secs = fut.result()
                except SecureFedError as exc:  # a run that cannot start: reported, the rest of the study goes on
                    print(f"[{i}/{len(points)}] {method} ε={_label(eps)} seed {seed}: error: {exc}", file=sys.stderr, flush=True)
                    failed.append(run_dir)
                    cells.advance()
                    continue
                final = summary.get("final", {})
                util = next((f"{k} {final[k]:.2f}" for k in ("P@1", "mAP", "GmAP") if k in final), summary["status"])
                elapsed = time.time() - t0
                eta = elapsed / i * (len(points) - i)
                eps_run = summary.get("privacy", {}).get("epsilon", "inf")
                eps_txt = eps_run if isinstance(eps_run, str) else f"{eps_run:.3g}"
                print(f"[{i}/{len(points)}] {method} ε={_label(eps)} seed {seed}: {util}, ε spent {eps_txt} "
                      f"({secs:.0f} s; study {elapsed / 60:.1f} min, about {eta / 60:.1f} min left)", flush=True)  # fmt: skip
                if summary["status"] in ("failed", "diverged"):
                    failed.append(run_dir)
                cells.advance()  # a line on stderr at least every 10 s while the next cell runs (secure_fed.progress)
    done = [pt for pt in points if (pt[4] / "metrics.jsonl").is_file()]
    rows = [run_row(pt[4], method=pt[0], operator=True) for pt in done]
    for r, pt in zip(rows, done, strict=True):
        r["target_epsilon"] = pt[1]
    return _write_study(args, out, methods, seeds, rows, [pt[4] for pt in done], failed, len(points))


def check_selection_options(args: argparse.Namespace) -> None:
    """``--select private``'s options, checked before anything runs (one ``error:`` line, exit 2)."""
    if args.select != "private":
        if args.candidates:
            raise SecureFedError("--candidates: give --select private (the grid is only searched by a private selection)")
        return
    from threat_models.private_selection import parse_candidates

    if on_validation(args):
        raise SecureFedError(
            "--select private with dataset.evaluate_on validation: the selection would score its candidates on training "
            "rows with no noise, outside the ε it reports; select privately on the test split's selection half, or "
            "select on the validation split without --select (a choice outside ε, to be stated)"
        )
    parse_candidates(args.candidates)
    if not (args.select_mean > 1 and math.isfinite(args.select_mean)):
        raise SecureFedError(f"--select-mean {args.select_mean:g}: the mean number of runs must be > 1")
    if not (args.select_eta >= 0 and math.isfinite(args.select_eta)):
        raise SecureFedError(f"--select-eta {args.select_eta:g}: give η ≥ 0 (1: geometric, 0: logarithmic)")
    if not (0 < args.select_fraction < 1):
        raise SecureFedError(f"--select-fraction {args.select_fraction:g}: give a fraction in (0, 1)")


def _write_study(args, out: Path, methods, seeds, rows, runs, failed, n_points: int) -> int:
    """results.csv, the plots and report.html (and the operator's copies with the attacks' columns)."""
    from secure_fed.plugin_api.attacks import has_operator_columns, html_report, released, write_csv

    validation = on_validation(args)
    out.mkdir(parents=True, exist_ok=True)
    public = [released(r) for r in rows]
    write_csv(public, out / "results.csv")
    note = (
        f"config: {args.config or 'the embedded default'}; overrides: {' '.join(args.overrides) or 'none'}; "
        f"unit: {args.unit}; ε = ∞ runs: {INFINITY_POINTS[args.infinity]}"
        + (
            "; a statistics-only method's (the label prior): its exact statistic, without the dp layer"
            if any(statistic_mechanism(m) for m in methods)
            else ""
        )  # fmt: skip
        + f". Bands: min–max over seeds {seeds}."
    )
    if args.select == "private":
        note += f" Private selection: {rows[0]['composed'] if rows else ''}; metrics on the report half of the test split."
    if validation:
        note += f" {VALIDATION_NOTE}"
    table = study_table(public, validation=validation)
    if table:
        (out / "table.md").write_text(table)
        print(table, end="")
    title = f"privacy/utility trade-off: {', '.join(methods)}"
    page = html_report(runs, out / "report.html", title=title, plots_dir=out, notes=[note], rows=public)
    print(f"wrote {out / 'results.csv'}, the plots and {page}")
    if has_operator_columns(rows):  # the attacks' results: computed from the members, for the operator only
        private = out / PRIVATE_DIR
        private.mkdir(exist_ok=True)
        write_csv(rows, private / "results.csv")
        page = html_report(runs, private / "report.html", title=f"{title}, with the attacks (operator-only)", plots_dir=private,
                           notes=[note], rows=rows)  # fmt: skip
        print(f"wrote {private / 'results.csv'}, the attack plots and {page} (operator-only: do not release {private})")
    if failed:
        print(f"error: {len(failed)} of {n_points} runs did not train ({failed[0]})", file=sys.stderr)
        return 1
    return 0


def on_validation(args: argparse.Namespace) -> bool:
    """Whether the study's config (with its overrides) evaluates on a validation split of the training data."""
    from secure_fed.config import raw_config

    dataset = raw_config(args.config, args.overrides).get("dataset") or {}
    return isinstance(dataset, dict) and dataset.get("evaluate_on") == "validation"


def prior_method(args: argparse.Namespace, methods: list[str]) -> tuple[list[str], str]:
    """``--prior auto``: the "label prior only" method to add (the registered statistics-only algorithm whose statistic a
    DP mechanism plugin releases, :func:`~threat_models.tradeoff_points.statistic_methods`: ``label_prior``), and a
    line saying why or why not. It is drawn at the
    instance unit (its release is accounted per instance) and without ``--select private`` (no candidate grid
    applies to it)."""
    found = statistic_methods()
    if args.prior != "auto" or not found or found[0] in methods:
        return [], ""
    prior = found[0]
    if args.unit != "instance" or args.select == "private":
        why = "--unit client (its release is accounted per instance)" if args.unit != "instance" else "--select private"
        return [], f"no label-prior row under {why}"
    try:
        method_base(args.config, args.overrides, prior)
    except SecureFedError as exc:
        return [], f"no label-prior row: the config does not run as {prior} ({exc})"
    return [prior], (f"the label prior only ({prior}: the most frequent labels, private at each ε) is a row "
                            "(--prior none: not)")  # fmt: skip


def study_table(rows: list[dict], *, validation: bool = False) -> str:
    """The study at a glance (``table.md``): one line per method, one column per target ε, each cell the mean over
    seeds of P@1 / P@3 / mAP (those the runs have) and the number of runs that have them; under
    ``dataset.evaluate_on: validation`` a line says whose metrics they are."""
    keys = [k for k in ("P@1", "P@3", "mAP") if any(_finite(r.get(k)) for r in rows)]
    if not keys:
        return ""
    eps = sorted({float(r["target_epsilon"]) for r in rows})
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = [f"| method | {' | '.join(f'ε = {_label(e)}' for e in eps)} |", "| --- |" + " --- |" * len(eps)]
    for m in methods:
        cells = []
        for e in eps:
            pts = [r for r in rows if r["method"] == m and float(r["target_epsilon"]) == e and _finite(r.get(keys[0]))]
            vals = [[r[k] for r in pts if _finite(r.get(k))] for k in keys]
            cells.append(" / ".join(f"{sum(v) / len(v):.1f}" if v else "–" for v in vals) + f" ({len(pts)})" if pts else "–")
        lines.append(f"| {m} | {' | '.join(cells)} |")
    head = f"{' / '.join(keys)}, mean over seeds (number of runs)\n\n"
    if validation:
        head += f"{VALIDATION_NOTE}\n\n"
    return head + "\n".join(lines) + "\n"


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def register(sub) -> None:
    p = sub.add_parser("tradeoff", help="privacy/utility study: methods × ε × seeds, attacks, results.csv, report.html")
    p.add_argument("config", nargs="?", default=None, help="config file (default: the embedded default)")
    p.add_argument("--epsilons", default="1,2,4,8,inf", help="target ε values; inf: the point --infinity names")
    p.add_argument("--infinity", choices=list(INFINITY_POINTS), default="no-dp",
                   help="the ε = ∞ point: " + "; ".join(f"{k}: {v}" for k, v in INFINITY_POINTS.items()))  # fmt: skip
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--methods", default=None, help="comma-separated algorithm names (default: the config's)")
    p.add_argument("--attacks", default="", help="comma-separated attacks to run on every run (secure-fed list names them)")
    p.add_argument("--unit", choices=["instance", "client"], default="instance", help="the privacy unit whose ε is swept")
    p.add_argument("--reference", choices=["auto", "none"], default="auto",
                   help="auto: add the central DP reference (oracle) beside positive-only methods swept at the instance "
                        "unit when the config sets privacy.local; none: only --methods")  # fmt: skip
    p.add_argument("--prior", choices=["auto", "none"], default="auto",
                   help="auto: a 'label prior only' row (label_prior: every instance scored by the label counts, released "
                   "under DP at each ε) beside the methods")  # fmt: skip
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value in every run (repeatable)")  # fmt: skip
    p.add_argument("--workers", type=int, default=None, help="processes (default: the cores, at most one per run)")
    p.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")
    p.add_argument("--select", choices=["none", "private"], default="none",
                   help="private: each point is the best of K ~ truncated negative binomial runs over --candidates, "
                        "K secret, ε covering the selection (Papernot & Steinke 2022, Thm 2)")  # fmt: skip
    p.add_argument("--candidates", action="append", default=[], metavar="KEY=V1,V2",
                   help="with --select private: a grid axis of config overrides (repeatable)")  # fmt: skip
    p.add_argument("--select-mean", type=float, default=3.0, help="with --select private: E[K], the mean number of runs")
    p.add_argument("--select-eta", type=float, default=1.0, help="with --select private: η (1 geometric, 0 logarithmic)")
    p.add_argument("--select-metric", default="P@1", help="with --select private: the score, on the selection test rows")
    p.add_argument("--select-fraction", type=float, default=0.5, help="with --select private: the test split's selection share")
    p.add_argument("--out", required=True, help="study directory (runs/, results.csv, plots, report.html)")
    p.set_defaults(func=cmd_tradeoff)
