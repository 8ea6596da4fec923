"""The ``secure-fed`` command line.

    secure-fed run [CONFIG] [--set key.path=value ...] [--data-root DIR] [--out DIR]
    secure-fed resume RUN_DIR            (same as: secure-fed run --resume RUN_DIR)
    secure-fed sweep [CONFIG] --grid key=v1,v2 [--grid ...] [--seeds 0,1,2] [--out DIR]
    secure-fed report RUN_DIR [RUN_DIR ...] [--out FILE.png] [--vary KEY] [--allow-mixed]
    secure-fed validate [CONFIG] [--set ...]
    secure-fed partition CONFIG [--set ...] [--data-root DIR] [--out DIR]
    secure-fed audit RUN_DIR [--attacks a,b] [--set attacks.KEY=VALUE ...] [--data-root DIR]
    secure-fed export RUN_DIR --out MODEL.pt
    secure-fed list
    secure-fed data download NAME [--root DIR] [--mirror URL]
    secure-fed flower certificates --out DIR [--host H ...]
    secure-fed flower local [CONFIG] [--nodes N] [--set ...] [--out DIR] [--resume]

User mistakes (bad config, missing file) print one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from secure_fed.api import default_run_dir
from secure_fed.errors import SecureFedError, one_line
from secure_fed.io import check_writable_dir
from secure_fed.run_files import PRIVACY_RECORD, PRIVATE_DIR, holds_checkpoint, operator_config_path
from secure_fed.run_status import trained


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
    p.add_argument(
        "--backend", choices=["inprocess", "flower"], default=None,
        help="where the clients run (the config's backend key; flower: Flower's simulation engine)",
    )  # fmt: skip


def _run_dir_for(plan, out: str | None) -> Path:
    return Path(out) if out else default_run_dir(plan)


def _print_summary(summary: dict, run_dir: Path, private: dict) -> None:
    """The end of a run on the console: what ran, the released metrics, the run directory, then the released privacy
    record (the model's ε, one line per DP unit: δ, what it covers, the adversaries, what is not covered)."""
    from secure_fed.privacy_lines import privacy_lines

    final = summary["final"]
    shown = ("mAP", "GmAP", "AmAP", "WmAP")
    metrics = "  ".join(f"{k} {v:.2f}" for k, v in final.items() if k.startswith("P@") or k in shown) or "(no evaluation)"
    cos = summary.get("W_mean_cos")
    n = summary["rounds_completed"]
    print(
        f"{summary['algorithm']} on {summary['dataset']}: {n} round{'' if n == 1 else 's'} "
        f"in {private['wall_seconds']:.1f}s ({private['seconds_per_round']:.2f}s/round) [{summary['status']}]"
    )
    print(f"  {metrics}" + (f"  mean cos(W) {cos:.3f}" if cos is not None else ""))
    print(f"  run directory: {run_dir} (private/ holds the operator's diagnostics: do not release it)")
    if "warning" in summary[PRIVACY_RECORD]:
        print(f"  warning: {summary[PRIVACY_RECORD]['warning']}")
    print("\n".join(privacy_lines(summary[PRIVACY_RECORD], str(run_dir / "config.yaml"))))
    if line := aborted_line(summary):
        print(line)


def aborted_line(summary: dict) -> str | None:
    """The console's last line for a run with aborted rounds: how many, and what the privacy ledger charged for them."""
    n = summary.get("rounds_aborted") or 0
    if not n:
        return None
    total = summary["rounds_completed"]
    line = (f"  {n} of {total} round{'' if total == 1 else 's'} aborted (a protocol could not finish them; nothing of "
            "theirs was applied; the reasons are in private/diagnostics.jsonl)")  # fmt: skip
    charge = summary.get("aborted_charge") or {}
    if charge:
        units = "; ".join(f"{u} unit {c['steps']} of its {c['of']} steps" for u, c in charge.items())
        eps = summary[PRIVACY_RECORD]["epsilon"]
        eps = f"{eps:.4g}" if isinstance(eps, float) else eps
        line += f"; the privacy ledger charged them: {units} (ε = {eps} includes them)"
    elif summary[PRIVACY_RECORD].get("units"):
        line += "; the privacy ledger charged them nothing"
    return line


def cmd_run(args: argparse.Namespace) -> int:
    from secure_fed.config import load_plan
    from secure_fed.data.from_config import check_data_files

    if args.out is not None and not args.out.strip():
        raise SecureFedError("--out: empty path")
    if args.resume:
        run_dir = Path(args.resume)
        if not operator_config_path(run_dir).is_file():  # the config with its secret settings, under private/
            raise SecureFedError(f"cannot resume: {operator_config_path(run_dir)} not found")
        if args.config:
            raise SecureFedError("give either CONFIG or --resume RUN_DIR, not both")
        if args.out is not None and Path(args.out).resolve() != run_dir.resolve():
            raise SecureFedError("--out cannot be combined with --resume: the run continues in RUN_DIR")
        plan = load_plan(operator_config_path(run_dir), args.overrides)
    else:
        plan = load_plan(args.config, args.overrides)
        run_dir = _run_dir_for(plan, args.out)
        if holds_checkpoint(run_dir):
            raise SecureFedError(f"{run_dir} already holds a run; use --resume {run_dir} or another --out")
    check_writable_dir(run_dir)
    check_data_files(plan.dataset, args.data_root)  # a missing data file: its error line before torch is imported
    from secure_fed.engine import Experiment  # imports torch: after every check the config and its files allow

    exp = Experiment(plan, run_dir=run_dir, data_root=args.data_root)
    print(exp.dataset.describe())
    if args.resume:
        if exp.resume():
            print(f"resuming {run_dir} from round {exp.round}")
            if exp.round >= plan.training.rounds:
                print(f"  it has run all {plan.training.rounds} planned rounds: nothing to train (to extend it, "
                      f"--set training.rounds={exp.round + 10}, say)")  # fmt: skip
        else:
            print(f"no checkpoint in {run_dir}; starting from round 0")
    result = exp.run()  # Ctrl-C in training: the run stops, checkpoints and reports itself "interrupted"
    _print_summary(result.summary, run_dir, result.private)
    status = result.summary["status"]
    if status == "interrupted":
        resume = f"secure-fed resume {shlex.quote(str(run_dir))}"
        n = result.summary["rounds_completed"]
        print(
            f"interrupted after round {n}; its checkpoint is in {run_dir / 'checkpoints'}; to continue: {resume}", file=sys.stderr
        )
        return 130
    try:
        for cb in exp.callbacks:  # e.g. threat_models' attack taps run the configured attacks
            cb.on_cli_run_end(exp.context(), result)
    except KeyboardInterrupt:
        print(f"interrupted after training: the run is complete in {run_dir}", file=sys.stderr)
        return 130
    if status in ("failed", "diverged"):
        print(f"error: {result.summary['stop_reason']}", file=sys.stderr)
        return 1
    return 0 if trained(status) else 130


def cmd_resume(args: argparse.Namespace) -> int:
    args.resume, args.config, args.out = args.run_dir, None, None
    return cmd_run(args)


def cmd_validate(args: argparse.Namespace) -> int:
    from secure_fed.config import load_plan
    from secure_fed.validation import validation_lines

    plan = load_plan(args.config, args.overrides)
    for line in validation_lines(plan, args.data_root, source=args.config or "the embedded default"):
        print(line)
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """Partition the configured training set and write its heterogeneity report (sizes, label skew, KL)."""
    import numpy as np

    from secure_fed.config import load_plan
    from secure_fed.data import partitioner_from_config
    from secure_fed.data.from_config import build_dataset  # the engine's loader (torch-free)
    from secure_fed.data.heterogeneity import heterogeneity_report, write_report
    from secure_fed.plugin_specs import instance_bound

    plan = load_plan(args.config, args.overrides)
    name = plan.partition.name
    out = Path(args.out) if args.out else Path(plan.output.dir) / f"partition-{plan.dataset.name or 'data'}-{name}"
    check_writable_dir(out, what="--out")
    ds = build_dataset(plan, args.data_root)
    print(ds.describe())
    rng = np.random.default_rng([plan.seed, 11])  # the stream engine.builders.build_federation partitions with
    part = partitioner_from_config(plan.partition, seed=plan.seed)
    train = ds.train
    if part.positive_only and (bound := instance_bound(plan)) is not None:  # the run's contribution bound, as it applies it
        from secure_fed.data import MultiLabelSplit
        from secure_fed.data.bounding import bound_labels, bounding_key

        labels, _ = bound_labels(train.labels, train.features, bound[0], bound[1], bounding_key(plan.seed))
        train, part.allow_empty = MultiLabelSplit(train.features, labels), True
    shards = part.partition(train, rng)
    rep = heterogeneity_report(train.labels, shards, label_names=ds.label_names)
    rep.update(dataset=ds.name, partition=dataclasses.asdict(plan.partition), seed=plan.seed)
    json_path, png_path = write_report(rep, out, title=f"{ds.name}: {name}, {len(shards)} clients, seed {plan.seed}")
    st = rep["size_stats"]
    print(f"{'partition':<14} {'clients':>7} {'size min':>8} {'median':>8} {'max':>8} {'total KL':>10} {'mean KL':>9}")
    print(f"{name:<14} {rep['num_clients']:>7} {st['min']:>8} {st['median']:>8g} {st['max']:>8} "
          f"{rep['kl_total']:>10.4g} {rep['kl_mean']:>9.4g}")  # fmt: skip
    print(f"  total KL = sum over client pairs i != j of KL(p_i || p_j), label distributions smoothed by ε = {rep['epsilon']:g}")
    if rep["clients_without_labels"]:
        print(f"  note: clients {rep['clients_without_labels'][:10]} hold no positive label")
    print(f"wrote {json_path} and {png_path}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from secure_fed import catalog
    from secure_fed.data import GENERATED, PARTITIONERS, REGISTRY
    from secure_fed.plugin_specs import attack_specs, layer_specs

    def section(title: str, rows: list[tuple[str, str]]) -> None:
        print(f"{title}:")
        if not rows:
            print("  (none available yet)")
        for name, desc in rows:
            print(f"  {name:<14} {desc}")

    section("algorithms", list(catalog.ALGORITHMS.items()))
    section(
        "datasets",
        [(n, d.description) for n, d in REGISTRY.items()] + list(GENERATED.items()),
    )
    section("partitioners", [(n, c.description) for n, c in PARTITIONERS.items()])
    section("models", list(catalog.MODELS.items()))
    section("protocols", [(n, spec.threat_model) for n, spec in layer_specs().items()])
    print("attacks:")
    specs = attack_specs()
    if not specs:
        print("  (none available yet)")
    for n, spec in specs.items():
        print(f"  {n:<25} [{spec.role}] {spec.description}")
        print(f"  {'':<25} needs: {spec.needs}")
        print(f"  {'':<25} defended by: {spec.defended_by}")
    return 0


def cmd_data_download(args: argparse.Namespace) -> int:
    from secure_fed.data.download import download

    for path in download(args.name, args.root, mirror=args.mirror, force=args.force):
        print(f"ok  {path}")
    return 0


def cmd_data_synth_xc(args: argparse.Namespace) -> int:
    from secure_fed.data.synth_xc import scaled_shape, synth_xc

    shape = scaled_shape(args.like, args.scale)  # bad --like/--scale: an error before anything is written
    out = check_writable_dir(args.out, what="--out")
    if not args.force and any((out / f).exists() for f in ("train.txt", "test.txt")):
        raise SecureFedError(f"--out {out}: train.txt or test.txt already exists (use --force to overwrite)")
    print(
        f"writing {args.like} x{args.scale:g}: {shape.train:,} train + {shape.test:,} test rows, {shape.features:,} "
        f"features, {shape.labels:,} labels, ~{shape.labels_per_instance:.2f} labels and ~{shape.nnz_per_row:.0f} "
        f"non-zeros per row -> {out}/",
        file=sys.stderr,
    )

    def progress(split: str, done: int, total: int) -> None:
        print(f"  {split}: {done:,}/{total:,} rows", file=sys.stderr, flush=True)

    synth_xc(args.like, out=out, scale=args.scale, seed=args.seed, progress=progress)
    print(f"ok  {out / 'train.txt'}\nok  {out / 'test.txt'}")
    return 0


def _parse_grid(items: list[str]) -> list[tuple[str, list[str]]]:
    grid = []
    for item in items:
        if "=" not in item:
            raise SecureFedError(f"--grid {item!r}: expected key.path=v1,v2,...")
        key, vals = item.split("=", 1)
        values = [v for v in vals.split(",") if v != ""]
        key = key.strip()
        if not key or not values:
            raise SecureFedError(f"--grid {item!r}: expected key.path=v1,v2,... with at least one value")
        if key == "seed":
            raise SecureFedError("--grid seed: the seeds are swept by --seeds")
        if key in (k for k, _ in grid):
            raise SecureFedError(f"--grid {key}: given twice; list all its values in one --grid {key}=v1,v2,...")
        if (dup := next((v for i, v in enumerate(values) if v in values[:i]), None)) is not None:
            raise SecureFedError(f"--grid {item!r}: value {dup!r} listed twice")
        grid.append((key, values))
    return grid


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip() != ""]
    except ValueError:
        raise SecureFedError(f"--seeds {text!r}: expected comma-separated integers, e.g. 0,1,2") from None
    if not seeds:
        raise SecureFedError(f"--seeds {text!r}: give at least one seed")
    if (dup := next((s for i, s in enumerate(seeds) if s in seeds[:i]), None)) is not None:
        raise SecureFedError(f"--seeds {text!r}: seed {dup} listed twice")
    return seeds


def cmd_sweep(args: argparse.Namespace) -> int:
    from secure_fed.config import load_plan
    from secure_fed.sweep import cached_summary, run_cached

    grid = _parse_grid(args.grid)
    seeds = _parse_seeds(args.seeds)
    base = load_plan(args.config, args.overrides)
    out = Path(args.out or Path(base.output.dir) / f"sweep-{base.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    check_writable_dir(out, what="--out")
    combos = list(itertools.product(*[[(k, v) for v in vs] for k, vs in grid])) or [()]
    points = []
    for combo in combos:  # validate every point, and every cached run's config, before anything runs
        for seed in seeds:
            plan = load_plan(args.config, list(args.overrides) + [f"{k}={v}" for k, v in combo] + [f"seed={seed}"])
            tag = "-".join(f"{k.split('.')[-1]}{v}" for k, v in combo) or "base"
            run_dir = out / f"{tag}-seed{seed}"
            cached_summary(plan, run_dir)
            points.append((combo, seed, tag, plan, run_dir))
    rows = []
    for i, (combo, seed, tag, plan, run_dir) in enumerate(points, 1):
        summary = run_cached(plan, run_dir, data_root=args.data_root, progress=plan.output.progress)
        rows.append({"point": dict(combo), "seed": seed, "status": summary["status"], "final": summary["final"],
                     "run_dir": str(run_dir)})  # fmt: skip
        head = " ".join(f"{k} {v:.2f}" for k, v in summary["final"].items() if k.startswith("P@") or k == "mAP")
        print(f"[{i}/{len(points)}] {tag} seed {seed}: {head or summary['status']}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(rows, indent=2))
    print(f"wrote {out / 'sweep.json'}")
    bad = [r for r in rows if r["status"] in ("failed", "diverged")]
    if bad:
        print(f"error: {len(bad)} of {len(rows)} sweep points did not train ({bad[0]['run_dir']}: {bad[0]['status']})",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from secure_fed.report import report
    from secure_fed.run_history import load_run

    out = Path(args.out) if args.out else None
    if out is not None:
        if out.is_dir() or out.suffix.lower() != ".png":
            raise SecureFedError(f"--out {out}: expected the path of a .png file to write")
        check_writable_dir(out.parent, what="--out's folder")
    from secure_fed.html_report import has_operator_columns, html_report, released, run_row
    from secure_fed.report_setup import mixed_runs_message, setup_differences

    runs = [Path(d) for d in args.run_dirs]
    rows = [run_row(d, operator=True) for d in runs]  # every run loads before anything is written
    if not any(load_run(d)[0] for d in runs):
        raise SecureFedError(f"nothing to report: no evaluated round in {', '.join(map(str, runs))} (metrics.jsonl)")
    vary = tuple(args.vary)
    diffs = setup_differences(runs, vary=vary)  # runs drawn side by side differ only in ε, seed and what --vary names
    warning = mixed_runs_message(diffs) if diffs else None
    if warning and not args.allow_mixed:
        raise SecureFedError(f"{warning} (report runs of one setup, name a swept setting with --vary KEY, or pass "
                             "--allow-mixed to draw them under a warning)")  # fmt: skip
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    folder = out.parent if out is not None else runs[0]
    if out is None:
        check_writable_dir(runs[0], what="run directory")  # report.png and report.html go there
    operator = has_operator_columns(rows)  # the audits' results: computed from the members, a page for the operator only
    if operator:
        check_writable_dir(folder / PRIVATE_DIR, what="the report's private/ folder")
    path = report(runs, out=out, warning=warning, vary=vary)
    print(f"wrote {path}")
    title = f"secure-fed report: {len(runs)} run(s)"
    page = html_report(runs, path.with_suffix(".html"), title=title, rows=[released(r) for r in rows], warning=warning)
    print(f"wrote {page} (open it in a browser: sortable table, plots embedded)")
    if operator:
        private = path.parent / PRIVATE_DIR / path.with_suffix(".html").name
        private.parent.mkdir(parents=True, exist_ok=True)
        page = html_report(runs, private, title=f"{title}, with the audits (operator-only)", rows=rows, warning=warning)
        print(f"wrote {page} (operator-only: with the audits' results; do not release it)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """The release-safe model of a finished run: θ, W, the public config and the privacy report, nothing else."""
    from secure_fed.export import export_model

    if not args.out.strip():
        raise SecureFedError("--out: empty path")
    path = export_model(args.run_dir, args.out)
    print(f"wrote {path} (θ, W, the public config and the privacy report: the run's release-safe model)")
    return 0


def cmd_flower_certificates(args: argparse.Namespace) -> int:
    from secure_fed.engine.flower.certificates import generate_certificates

    if args.days < 1:
        raise SecureFedError(f"--days {args.days}: the certificates must be valid for at least 1 day")
    if bad := [h for h in args.hosts if not h.strip() or len(h) > 253]:
        raise SecureFedError(f"--host {bad[0]!r}: not an IP address or DNS name")
    out = Path(args.out)
    check_writable_dir(out, what="--out")
    paths = generate_certificates(out, args.hosts or ["127.0.0.1", "localhost"], days=args.days)
    for name, path in paths.items():
        print(f"wrote {path}" + ("  (private: keep it on the SuperLink / offline)" if name.endswith(".key") else ""))
    return 0


def cmd_flower_local(args: argparse.Namespace) -> int:
    """A TLS SuperLink and N SuperNodes on this machine, one `flwr run` of the experiment, then shut down."""
    from secure_fed.config import load_plan

    if not args.timeout > 0:
        raise SecureFedError(f"--timeout {args.timeout:g}: the run needs a positive number of seconds")
    if args.nodes < 1:
        raise SecureFedError(f"--nodes {args.nodes}: at least 1 SuperNode")
    if args.resume and args.out is None:
        raise SecureFedError("--resume needs --out RUN_DIR: the run directory to continue")
    from secure_fed.engine.flower.link_proxy import LinkShape

    shaped = any(v is not None for v in (args.link_delay, args.link_jitter, args.link_loss, args.link_reset))
    link = LinkShape(delay_ms=args.link_delay or 0.0, jitter_ms=args.link_jitter or 0.0, loss=args.link_loss or 0.0,
                     reset=args.link_reset or 0.0, seed=args.link_seed) if shaped else None  # fmt: skip
    if args.resume and args.config is None and operator_config_path(args.out).is_file():
        args.config = str(operator_config_path(args.out))  # the run's own config (secrets included), not the default
    overrides = [o for o in args.overrides if not o.startswith("backend=")]
    overrides.append(f"flower.num_supernodes={args.nodes}")
    plan = load_plan(args.config, [*overrides, "backend=flower"])  # a bad config stops here, nothing started
    run_dir = _run_dir_for(plan, args.out)
    if args.resume and not holds_checkpoint(run_dir):
        raise SecureFedError(f"--resume: {run_dir} holds no checkpoint to continue")
    if not args.resume and run_dir.exists() and any(run_dir.iterdir()):
        raise SecureFedError(f"--out {run_dir} is not empty; give a new run directory (or --resume to continue it)")
    check_writable_dir(run_dir)
    from secure_fed.data.from_config import check_data_files

    # before any process starts, at the root the ServerApp will read (flwr_app: --data-root, else $SECURE_FED_DATA)
    check_data_files(plan.dataset, args.data_root or os.environ.get("SECURE_FED_DATA"))
    from secure_fed.engine.flower.deployment import LocalDeployment, round_seconds
    from secure_fed.engine.flower.node_memory import MemorySampler

    work = Path(args.workdir) if args.workdir else run_dir.parent / f".{run_dir.name}-flower"
    print(f"starting a SuperLink and {args.nodes} authenticated SuperNodes on 127.0.0.1 over TLS (logs in {work})"
          + (f"; links shaped by a proxy: {link}" if link else ""))  # fmt: skip
    with LocalDeployment(work, nodes=args.nodes, data_root=args.data_root, clientapps=args.clientapps, link=link,
                         database=not args.superlink_in_memory) as dep:  # fmt: skip
        print(f"flwr run experiments/flower-app secure-fed-local (SuperLink on port {dep.port}; log in {work}/flwr-run.log)")
        with MemorySampler(dep.node_pids) as memory:
            try:
                done = dep.run(out=run_dir, config=args.config, overrides=overrides, timeout_s=args.timeout,
                               resume=args.resume)  # fmt: skip
            except subprocess.TimeoutExpired:
                done = None
        proxy = dep.proxy
    rounds = round_seconds(run_dir)
    report = {"nodes": args.nodes, "clientapps": args.clientapps, "finished": done is not None and done.returncode == 0,
              "round_seconds": rounds, "pss": memory.summary(),
              "link": None if link is None else {**vars(link), "connections": proxy.stats.connections,
                                                  "chunks": proxy.stats.chunks, "lost": proxy.stats.lost,
                                                  "resets": proxy.stats.resets}}  # fmt: skip
    (work / "deployment.json").write_text(json.dumps(report, indent=1) + "\n")  # timings and memory: the operator's, not released
    if done is None:
        raise SecureFedError(f"the Flower run did not finish within --timeout {args.timeout:g} s ({len(rounds)} rounds "
                             f"done; round times and memory in {work}/deployment.json); see {work}/flwr-run.log")  # fmt: skip
    summary_path = run_dir / "summary.json"
    if done.returncode != 0 or not summary_path.is_file():
        raise SecureFedError(f"the Flower run did not finish (flwr run exit {done.returncode}); see {work}/flwr-run.log")
    summary = json.loads(summary_path.read_text())
    private = json.loads((run_dir / "private" / "summary.json").read_text())
    _print_summary(summary, run_dir, private)
    if rounds:
        mean = sum(rounds) / len(rounds)
        pss = report["pss"]
        print(f"deployment: {len(rounds)} rounds, {mean:.1f} s per round ({3600 / mean:.0f} rounds/hour), PSS per node "
              f"{pss.get('peak_mean_mib', 0):.0f} MiB mean peak, {pss.get('peak_max_mib', 0):.0f} MiB largest "
              f"(in {work}/deployment.json)")  # fmt: skip
    return 0 if trained(summary["status"]) else 1


def installed_version() -> str:
    """The version of the installed ``secure-fed`` distribution (its metadata, which pyproject.toml's version sets)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("secure-fed")
    except PackageNotFoundError:
        raise SecureFedError("secure-fed is not installed (no distribution metadata): pip install -e .") from None


class _VersionAction(argparse.Action):
    """``--version``: print ``secure-fed VERSION`` and exit 0; the metadata is read only when it is asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):  # noqa: A002
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            text = f"{parser.prog} {installed_version()}"
        except SecureFedError as exc:
            parser.exit(2, f"error: {exc}\n")
        print(text)  # on stdout, as argparse's own version action prints it
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="secure-fed", description="Privacy-hardened federated learning with positive labels.")
    ap.add_argument("--version", action=_VersionAction, help="print the installed version and exit")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run an experiment (the embedded default when CONFIG is omitted)")
    p.add_argument("config", nargs="?", default=None, help="config file (default: the embedded default)")
    _add_run_args(p)
    p.add_argument("--out", default=None, help="run directory (default: output.dir/ALGO-DATASET-TIMESTAMP)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a run from its last checkpoint")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("resume", help="continue a run from its last checkpoint")
    p.add_argument("run_dir", help="a run directory (its private/config.yaml and private/checkpoints/last.pt)")
    _add_run_args(p)
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("sweep", help="run a grid of overrides over seeds")
    p.add_argument("config", nargs="?", default=None, help="config file (default: the embedded default)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2", help="a swept key (repeatable)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, each a run of every grid point (default 0)")
    p.add_argument("--out", default=None, help="sweep directory (default: output.dir/sweep-ALGO-TIMESTAMP)")
    _add_run_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="plot metrics of one or more runs (report.png) and compare them (report.html)")
    p.add_argument("run_dirs", nargs="+", help="one or more run directories")
    p.add_argument("--out", default=None, help="PNG path (default: report.png in the first run directory)")
    p.add_argument("--vary", action="append", default=[], metavar="KEY",
                   help="a setting swept besides ε and seed (e.g. algorithm.lam): may differ; in the legends")  # fmt: skip
    p.add_argument("--allow-mixed", action="store_true",
                   help="draw runs that differ in more than ε and seed, under a warning (default: refuse them)")  # fmt: skip
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export", help="write a finished run's release-safe model (θ, W, public config, privacy report)")
    p.add_argument("run_dir", help="a finished run directory")
    p.add_argument("--out", required=True, help="the model file to write, e.g. model.pt")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("validate", help="check a config without running it (the embedded default when CONFIG is omitted)")
    p.add_argument("config", nargs="?", default=None, help="config file (default: the embedded default, as for run)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set training.rounds=10 (repeatable)")  # fmt: skip
    p.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("partition", help="partition the training set and report its heterogeneity (sizes, KL)")
    p.add_argument("config", help="config file")
    _add_run_args(p)
    p.add_argument("--out", default=None, help="report directory (default: output.dir/partition-DATASET-PARTITIONER)")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("list", help="list algorithms, datasets, partitioners, protocols and attacks")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("data", help="dataset utilities")
    dsub = p.add_subparsers(dest="data_command", required=True)
    d = dsub.add_parser("download", help="fetch a Mulan dataset and verify its SHA-256")
    d.add_argument("name", help="a Mulan data set (secure-fed list shows them)")
    d.add_argument("--root", default=None, help="data root (default: $SECURE_FED_DATA or ~/.cache/secure-fed/data)")
    d.add_argument("--mirror", default=None, help="base URL replacing the Mulan GitHub raw URL (file:// works)")
    d.add_argument("--force", action="store_true", help="download even if a verified copy exists")
    d.set_defaults(func=cmd_data_download)
    d = dsub.add_parser("synth-xc", help="write synthetic XC files with a benchmark's published shape (train.txt, test.txt)")
    d.add_argument("--like", required=True, help="eurlex-4k | amazoncat-13k | wiki-325k | amazon-670k")
    d.add_argument("--scale", type=float, default=1.0, help="instances and labels scaled by F in (0, 1] (default 1)")
    d.add_argument("--out", required=True, help="output folder (use it as dataset.train/test with format: xc)")
    d.add_argument("--seed", type=int, default=0, help="seed of the generated data (default 0)")
    d.add_argument("--force", action="store_true", help="overwrite existing files")
    d.set_defaults(func=cmd_data_synth_xc)

    p = sub.add_parser("flower", help="Flower deployment tools (TLS certificates; a local TLS deployment)")
    fsub = p.add_subparsers(dest="flower_command", required=True)
    f = fsub.add_parser("certificates", help="write a CA and a SuperLink certificate (ca.crt, server.pem, server.key)")
    f.add_argument("--out", required=True, help="folder for the four files")
    f.add_argument("--host", dest="hosts", action="append", default=[],
                   help="the SuperLink's IP address or DNS name (repeatable; default 127.0.0.1 and localhost)")  # fmt: skip
    f.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    f.set_defaults(func=cmd_flower_certificates)
    f = fsub.add_parser("local", help="run CONFIG through `flwr run` on a TLS SuperLink and N SuperNodes on 127.0.0.1")
    f.add_argument("config", nargs="?", default=None, help="config file (default: the embedded default)")
    f.add_argument("--nodes", type=int, default=3, help="SuperNodes (client c on node c mod N; default 3)")
    f.add_argument("--out", default=None, help="run directory (default: output.dir/NAME)")
    f.add_argument("--workdir", default=None, help="certificates, Flower home and logs (default: next to the run)")
    f.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take (default 3600)")
    f.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint (same CONFIG and --set; the nodes take up "
                        "their stored state from the work directory)")  # fmt: skip
    f.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    f.add_argument("--data-root", default=None, help="directory holding mulan/NAME/... (else $SECURE_FED_DATA)")
    f.add_argument("--clientapps", choices=["zygote", "worker", "superexec"], default="zygote",
                   help="each node's ClientApp process: one long-lived worker forked from a process that imported the "
                        "libraries (zygote, default) or started afresh (worker), or Flower's flower-superexec (one "
                        "flwr-clientapp process per message)")  # fmt: skip
    f.add_argument("--link-delay", type=float, default=None, metavar="MS", help="shaped links: delay per chunk (ms)")
    f.add_argument("--link-jitter", type=float, default=None, metavar="MS", help="shaped links: ± jitter (ms, uniform)")
    f.add_argument("--link-loss", type=float, default=None, metavar="P",
                   help="shaped links: probability a chunk is lost and retransmitted (200 ms later)")  # fmt: skip
    f.add_argument(
        "--link-reset",
        type=float,
        default=None,
        metavar="P",
        help="shaped links: probability a chunk cuts its connection (the message is lost; Flower retries)",
    )
    f.add_argument("--link-seed", type=int, default=0, help="shaped links: seed of the proxy's draws (default 0)")
    f.add_argument("--superlink-in-memory", action="store_true",
                   help="the SuperLink's state in memory instead of its SQLite file (no lock contention with many nodes; "
                        "no SuperLink restart)")  # fmt: skip
    f.set_defaults(func=cmd_flower_local)

    from secure_fed.plugins import registry

    for register in registry("commands").values():  # sub-commands of plugins (e.g. threat_models' `audit`)
        register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "backend", None):
        args.overrides.append(f"backend={args.backend}")
    try:
        status = args.func(args)
        sys.stdout.flush()  # here, so that a closed pipe is met inside the handler below and not at exit
        return status
    except SecureFedError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a run's own handler is in place (loading, setup): no traceback
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`secure-fed list | head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 141  # 128 + SIGPIPE, the status a shell reports for a tool killed by it


if __name__ == "__main__":
    raise SystemExit(main())
