"""``secure-fed tradeoff --select private``: each (method, ε, seed) point is the best of K DP runs, tuning counted in ε.

For every point, K ~ D_{η,γ} (mean ``--select-mean``) and K candidates (uniformly, with replacement, from the grid of
``--candidates KEY=v1,v2,…``) are drawn by a **secret** RNG (:func:`secret_rng`: ``secrets.SystemRandom``, never the
config seed) and stored in ``DIR.selection-private/POINT/draw.json`` (mode 0600, outside ``--out``), so that a
rerun after an interruption reuses the draw (a redraw would be a second selection). Each candidate trains there as
the ordinary run; the best by ``--select-metric`` on the *selection half* of the test split (public evaluation data,
split by a public permutation of the seed) is moved to ``DIR/runs/POINT``; its released metrics in ``results.csv``
are on the disjoint *report half*, so they are not biased by the choice. K, the unselected runs, their scores and
the number of runs are never released: the unselected directories are removed. Nor is it in when the released files
were written: the selection is written once all K candidates are scored, so every released file and folder of the
point (outside ``private/``) is stamped with the public time :data:`secure_fed.run_files.RELEASE_MTIME` once the
point is done, and the study's own files once the study is (:func:`secure_fed.run_files.stamp_released`).

``--epsilons`` are the TOTAL ε (selection included, :mod:`protocols.dp.private_selection`, Theorem 2): each run's
target ε is calibrated by bisection so that the selection over the grid's planned ledgers (public: config only)
meets it. The CSV states what is composed and what is not (the seeds: each seed's selection is its own release).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from secure_fed.plugin_api.attacks import SecureFedError

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan

#: the public permutation stream of the test split's selection / report halves (with the run's seed)
SPLIT_STREAM = 29


def secret_rng() -> random.Random:
    """The RNG of K and the candidates: the OS's CSPRNG (DP randomness is secret; never the config seed)."""
    return secrets.SystemRandom()


#: top-level config keys a candidate grid may not set: they change the mechanism or its accounting, which the
#: selection's ε takes from the point's own settings (privacy.<unit>.clip_norm is the one privacy key allowed)
FORBIDDEN_CANDIDATE_KEYS = ("privacy", "protocols", "seed", "attacks")


def candidate_key_allowed(key: str) -> bool:
    """Whether a ``--candidates`` axis may vary ``key`` (a dotted config key)."""
    head = key.split(".", 1)[0]
    if head == "privacy":
        return key.count(".") == 2 and key.endswith(".clip_norm")
    return head not in FORBIDDEN_CANDIDATE_KEYS


def parse_candidates(specs: list[str]) -> list[list[str]]:
    """``KEY=v1,v2`` (repeatable) → the grid: every combination, as override lists."""
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not vals:
            raise SecureFedError(f"--candidates {spec!r}: give KEY=v1,v2,… (a config key and at least one value)")
        key = key.strip()
        if not candidate_key_allowed(key):
            raise SecureFedError(
                f"--candidates {key}: the grid may not set privacy.*, protocols, seed or attacks (the selection's ε is "
                "computed from the point's own privacy settings; a clip norm, privacy.<unit>.clip_norm, is allowed: "
                "the noise scales with it)"
            )
        axes.append([f"{key}={v}" for v in vals])
    if not axes:
        raise SecureFedError("--select private needs --candidates KEY=v1,v2,… (the grid it selects from)")
    return [list(c) for c in itertools.product(*axes)]


def planned_parts(plan: RunPlan, unit: str) -> tuple[list[tuple[float, int, float | None]], float, str]:
    """The swept unit's mechanisms as planned by the run itself (built, not trained): (q, planned steps, σ or None
    when calibrated), δ and the accountant. A function of the config only."""
    from protocols.config_sections import PrivacyConfig
    from secure_fed.plugin_api.attacks import build_experiment

    p = plan.part(PrivacyConfig)
    if unit == "client" and getattr(p.client, "mechanism", None) == "tree":
        raise SecureFedError("--select private: the DP-FTRL tree ledger is not supported (its RDP is not (σ, q, steps))")
    if p.client is not None and (p.instance is not None or p.local is not None):
        # per instance, the released model also spends the client mechanism (through a group of clients); per client, the
        # instance mechanisms cover nothing (ε ∞): either way more than the one unit's ledger the selection accounts
        raise SecureFedError(
            f"--select private: the runs have instance and client units, and the released model's ε per {unit} composes "
            f"more than the {unit} unit's own ledger, which is all the selection accounts; select with one DP unit"
        )
    with tempfile.TemporaryDirectory(prefix="secure-fed-plan-") as tmp:
        rep = build_experiment(plan, run_dir=tmp).privacy_summary().get("units", {}).get(unit)
    if rep is None:
        raise SecureFedError(f"--select private: the runs have no {unit} unit to account")
    mechs = list(rep.get("mechanisms", {}).values()) or [rep]
    parts = [(float(m["sample_rate"]), int(m["planned_steps"]), None if m["sigma_calibrated"] else float(m["noise_multiplier"]))
             for m in mechs]  # fmt: skip
    return parts, float(rep["delta"]), str(rep["accountant"])


def planned_history(parts, *, target: float, delta: float, accountant: str) -> list[tuple[float, float, int]]:
    """The (σ, q, steps) history of a run calibrated to ``target`` (the σ the run's own calibration finds)."""
    from protocols.dp.accountant import calibrate_shared_sigma

    shared = None
    if any(s is None for _, _, s in parts):
        shared = calibrate_shared_sigma(target_epsilon=target, delta=delta, parts=parts, accountant=accountant)
    return [(s if s is not None else shared, q, n) for q, n, s in parts]


def calibrate_per_run(total: float, plans: list, *, eta: float, gamma: float) -> tuple[float, float]:
    """The largest per-run target ε (written with 6 significant digits as the runs read it) whose selection over the
    grid's plans keeps the total ε ≤ ``total``; returns (per-run ε, total ε).

    Each evaluation calibrates every distinct plan's σ as its run will (a grid over, say, the learning rate alone has
    one), so the search is a bracketed regula falsi (Illinois) in log ε rather than a bisection: a handful of
    evaluations, stopped once the total is within 0.2% below the target."""
    from protocols.dp.private_selection import selection_epsilon

    delta = plans[0][1]
    if any(d != delta for _, d, _ in plans):
        raise SecureFedError("--candidates: the candidates' runs have different δ (the selection needs one δ)")
    unique = list(dict.fromkeys((tuple(p), d, a) for p, d, a in plans))
    memo: dict[float, float] = {}

    def total_at(eps_r: float) -> float:
        if eps_r not in memo:
            try:
                hists = [planned_history(list(p), target=eps_r, delta=d, accountant=a) for p, d, a in unique]
                memo[eps_r] = selection_epsilon(hists, delta=delta, eta=eta, gamma=gamma)
            except (ValueError, RuntimeError):
                memo[eps_r] = math.inf  # the target cannot be met by a run (too low)
        return memo[eps_r]

    def g(x: float) -> float:  # < 0: feasible
        return math.log(total_at(math.exp(x))) - math.log(total) if math.isfinite(total_at(math.exp(x))) else math.inf

    hi = math.log(total)  # one run alone already spends the total: the selection spends more
    lo = hi - math.log(4.0)
    while g(lo) > 0:
        hi, lo = lo, lo - math.log(4.0)
        if lo < math.log(total) - math.log(1e4):
            raise SecureFedError(
                f"--epsilons {total:g}: no per-run ε keeps the selection within it (raise ε or lower --select-mean)"
            )
    g_lo, g_hi, side = g(lo), g(hi), 0
    for _ in range(40):
        if g_lo > math.log(1 - 2e-3) or hi - lo < 1e-6:
            break
        x = hi - math.log(4.0) / 2 if not math.isfinite(g_hi) else (lo * g_hi - hi * g_lo) / (g_hi - g_lo)
        gx = g(x)
        if gx <= 0:
            lo, g_lo = x, gx
            if side == -1 and math.isfinite(g_hi):
                g_hi /= 2  # Illinois: the stale end's value halved, so the bracket shrinks from both sides
            side = -1
        else:
            hi, g_hi = x, gx
            if side == 1:
                g_lo /= 2
            side = 1
    eps_r = float(f"{math.exp(lo) * (1 - 1e-5):g}")
    got = total_at(eps_r) if eps_r > 0 else math.inf
    if not got <= total:
        raise SecureFedError(f"--epsilons {total:g}: no per-run ε keeps the selection within it (raise ε or lower --select-mean)")
    return eps_r, got


def check_within_plan(cdir: Path, plan: tuple, eps_r: float, unit: str, cache: dict) -> None:
    """Refuse to release a selection one of whose candidates spent more than the plan its ε was computed from: the
    candidate's ledger (σ, q, steps) must have, at every Rényi order, an RDP no larger than its planned history at
    the per-run target (fewer steps, a larger σ pass)."""
    from protocols.dp.private_selection import rdp_curve
    from threat_models.one_run_fdp import ledger_history

    parts, delta, accountant = plan
    key = (tuple(parts), delta, accountant, eps_r)
    if key not in cache:
        cache[key] = planned_history(list(parts), target=eps_r, delta=delta, accountant=accountant)
    report = json.loads((cdir / "summary.json").read_text()).get("privacy", {}).get("units", {}).get(unit)
    spent = rdp_curve(ledger_history(report)) if report else np.full(1, math.inf)
    if not np.all(spent <= rdp_curve(cache[key]) * (1 + 1e-9) + 1e-12):
        raise SecureFedError(
            "--select private: a candidate's run spent more than the plan the selection's ε was computed from "
            "(its ledger is not within the planned (σ, q, steps)); nothing of this point is released"
        )


def write_private_json(path: Path, doc: dict[str, Any]) -> None:
    """A secret file: created mode 0600 (in a 0700 directory)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(path.with_suffix(".tmp"), path)


def draw(scratch: Path, grid_size: int, *, eta: float, gamma: float) -> dict[str, Any]:
    """The point's secret draw (K, the candidates' grid indices): the stored one if any, else a fresh one, stored."""
    from protocols.dp.private_selection import draw_count

    path = scratch / "draw.json"
    if path.is_file():
        return json.loads(path.read_text())
    rng = secret_rng()
    k = draw_count(rng, eta, gamma)
    doc = {"K": k, "candidates": [rng.randrange(grid_size) for _ in range(k)]}
    write_private_json(path, doc)
    return doc


def split_rows(n: int, seed: int, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The test split's selection rows and the disjoint report rows (a public permutation of the seed)."""
    order = np.random.default_rng([seed, SPLIT_STREAM]).permutation(n)
    k = max(1, min(n - 1, int(round(fraction * n))))
    return np.sort(order[:k]), np.sort(order[k:])


def half_metrics(run_dir: Path, seed: int, fraction: float, data_root: str | None) -> tuple[dict, dict, int]:
    """The released model's metrics on the selection half and on the report half of its test split, and the
    number of selection rows."""
    import scipy.sparse as sp

    from secure_fed.plugin_api.attacks import evaluate_scores
    from threat_models.context import AuditContext

    ctx = AuditContext.from_run_dir(run_dir, data_root=data_root)
    exp = ctx.exp
    ev = ctx.plan.evaluation
    scores = exp.model_scores(exp.theta, exp.fed.x_test)
    raw = exp.model_scores(exp.theta, exp.fed.x_test, centred=False) if ev.center_scores else scores
    y = exp.fed.y_test.toarray() if sp.issparse(exp.fed.y_test) else np.asarray(exp.fed.y_test)
    sel, rep = split_rows(len(y), seed, fraction)
    kw = {"ks": tuple(ev.ks), "threshold": ev.threshold}  # the threshold metrics read the raw scores, as the run's do

    def half(rows: np.ndarray) -> dict:
        return evaluate_scores(scores[rows], y[rows], threshold_scores=raw[rows], **kw)

    return half(sel), half(rep), len(sel)


COMPOSED = ("selection among the grid (Papernot & Steinke Thm 2, K secret) and each candidate's training; "
            "not composed: the seeds (each seed's selection is a separate release: S seeds released compose S times), "
            "the ε values of the curve, and the ε = inf reference; the selection score reads a half of the test "
            "split, which is treated as public evaluation data (no ε covers it)")  # fmt: skip


def run_selection(args, points: list, *, attacks: list[str], workers: int, threads: int, out: Path) -> tuple[list, list, list]:
    """Run every point as a private selection (module docstring). ``points``: the tradeoff's (method, ε, seed,
    overrides, run_dir) at the total ε. Returns (rows, released run dirs, failed points)."""

    from protocols.dp.private_selection import gamma_for_mean
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import ConfigError, run_row, stamp_released
    from threat_models.tradeoff_points import _job, _label, method_base, point_overrides, worker_pool

    grid = parse_candidates(args.candidates)
    eta, mean = args.select_eta, args.select_mean
    gamma = gamma_for_mean(mean, eta)
    scratch = Path(f"{out}.selection-private")
    calib: dict[tuple, tuple[float, float]] = {}
    plans_cache: dict[tuple[str, int], list] = {}
    planned: dict[tuple, list] = {}  # (plan, per-run ε) → the planned (σ, q, steps) history a candidate must stay within
    todo = []  # (point, eps_r, total, draw, [(candidate overrides, dir)])
    for method, eps, seed, ov, run_dir in points:

        def plan_of(extra, ov=ov, method=method, eps=eps):
            try:
                return load_plan(args.config, [*ov, *extra])
            except ConfigError as exc:
                raise SecureFedError(f"--candidates at {method}, ε = {_label(eps)}: {exc}") from None

        if math.isinf(eps):
            eps_r, total = math.inf, math.inf
        else:  # the plans of this seed's runs (steps and q may depend on the seed's partition)
            if (method, seed) not in plans_cache:
                plans_cache[(method, seed)] = [planned_parts(plan_of(c), args.unit) for c in grid]
            key = (eps, tuple((tuple(p), d, a) for p, d, a in plans_cache[(method, seed)]))
            if key not in calib:
                calib[key] = calibrate_per_run(eps, plans_cache[(method, seed)], eta=eta, gamma=gamma)
            eps_r, total = calib[key]
        if (run_dir / "selection.json").is_file():  # selected and released before: nothing to run
            todo.append(((method, eps, seed, ov, run_dir), eps_r, total, None, []))
            continue
        mb = method_base(args.config, args.overrides, method)
        pov = [
            *args.overrides,
            *point_overrides(mb, method=method, eps=eps_r, seed=seed, unit=args.unit, attacks=attacks, infinity=args.infinity),
        ]
        pdir = scratch / run_dir.name
        d = draw(pdir, len(grid), eta=eta, gamma=gamma)
        cands = []
        for j, gi in enumerate(d["candidates"]):
            cov = [*pov, *grid[gi]]
            plan_of(grid[gi])
            cands.append((grid[gi], cov, pdir / f"candidate-{j}"))
        todo.append(((method, eps, seed, ov, run_dir), eps_r, total, d, cands))
    rows, runs, failed = [], [], []
    jobs = [c for t in todo for c in t[4]]
    print(f"tradeoff: private selection (K ~ truncated negative binomial, η = {eta:g}, mean {mean:g}, over "
          f"{len(grid)} candidate(s)); the runs of each point are kept private in {scratch}", flush=True)  # fmt: skip
    with worker_pool(workers) as pool:
        futures = {str(c[2]): pool.submit(_job, args.config, c[1], str(c[2]), args.data_root, [], threads) for c in jobs}
        for (method, eps, seed, _, run_dir), eps_r, total, d, cands in todo:
            if d is not None:
                ok, statuses = True, {}
                for _, _, cdir in cands:
                    try:
                        summary, _ = futures[str(cdir)].result()
                        statuses[cdir] = summary["status"]
                        ok = ok and summary["status"] != "failed"
                    except SecureFedError:
                        ok = False
                if not ok:  # the draw stays (private): a rerun resumes the same selection, never a new one
                    print(f"{method} ε={_label(eps)} seed {seed}: error: a candidate did not train", flush=True)
                    failed.append(run_dir)
                    continue
                if not math.isinf(eps):
                    plans = plans_cache[(method, seed)]
                    for grid_ov, _, cdir in cands:
                        check_within_plan(cdir, plans[grid.index(grid_ov)], eps_r, args.unit, planned)
                scored = []
                for grid_ov, _, cdir in cands:
                    # a diverged run is an outcome of training like any score: the lowest, never a reason to stop
                    sel, rep, n = half_metrics(cdir, seed, args.select_fraction, args.data_root)
                    if args.select_metric not in sel:
                        raise SecureFedError(f"--select-metric {args.select_metric}: not a test metric here ({', '.join(sel)})")
                    score = sel[args.select_metric]
                    if statuses[cdir] == "diverged" or not math.isfinite(score):
                        score = -math.inf
                    scored.append((score, grid_ov, cdir, rep))
                best = max(range(len(scored)), key=lambda i: (scored[i][0], -i))
                _, grid_ov, cdir, rep = scored[best]
                write_selection(cdir, selection_record(grid_ov, eps_r, total, rep, n, args.select_metric))
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                os.replace(cdir, run_dir) if cdir.stat().st_dev == run_dir.parent.stat().st_dev else shutil.move(cdir, run_dir)
                shutil.rmtree(scratch / run_dir.name)  # the unselected runs, their scores and the draw (K)
                if attacks:
                    from threat_models.audit import audit_run_dir

                    audit_run_dir(str(run_dir), attacks, data_root=args.data_root, progress=False)
                stamp_released(run_dir)  # its files' times would otherwise grow with K (issue 52)
            info = json.loads((run_dir / "selection.json").read_text())
            info["epsilon"] = float(info["epsilon"])  # written "inf" where the gate made it ∞
            rows.append(selected_row(run_row(run_dir, method=method, operator=True), run_dir, info, grid_size=len(grid),
                                     eta=eta, mean=mean, target=eps))  # fmt: skip
            runs.append(run_dir)
            per_run = _label(info["per_run_target_epsilon"])
            print(f"{method} ε={_label(eps)} seed {seed}: selected {' '.join(info['selected'])}, "
                  f"ε {_label(info['epsilon'])} in all (each run's target {per_run})", flush=True)  # fmt: skip
    if scratch.is_dir() and not any(scratch.iterdir()):
        scratch.rmdir()
    return rows, runs, failed


#: the released record of a point's selection (in the selected run's folder)
SELECTION_FILE = "selection.json"


def selection_record(selected: list[str], per_run: float, total: float, report: dict[str, float], rows: int,
                     metric: str) -> dict[str, Any]:  # fmt: skip
    """``selection.json``'s fields, tagged for the release gate (:mod:`secure_fed.release`): the selected candidate
    is the private selection's output; the rest is the config's, or the released model's on the public test split."""
    from protocols.dp.private_selection import PrivateSelection
    from secure_fed.plugin_api.attacks import protected, public

    calibrated = "calibrated from the command's ε and the grid's planned ledgers (config only)"
    return {
        "selected": protected(selected, PrivateSelection.kind),
        "per_run_target_epsilon": public(per_run, calibrated),
        "epsilon": public(total, f"the selection's ε (Theorem 2), {calibrated}"),
        "report_metrics": public(
            report,
            "metrics of the selected (released) model on the report half of the public "
            "test split: a post-processing of DP outputs and public data",
        ),  # fmt: skip
        "selection_rows": public(rows, "the selection half's size: a public split of the public test split"),
        "select_metric": public(metric, "the command's --select-metric"),
    }


def write_selection(run_dir: Path, tagged: dict[str, Any]) -> dict[str, Any]:
    """Write ``selection.json`` through the release gate: an untagged field raises under strict mode, and otherwise
    makes the file's ``epsilon`` ∞, with the finding as its one-line ``why``; returns what it wrote."""
    from secure_fed.plugin_api.attacks import release_fields

    info, findings = release_fields(tagged, SELECTION_FILE)
    if findings:
        info["epsilon"], info["why"] = math.inf, "; ".join(findings)
    shown = {**info, "epsilon": "inf"} if not math.isfinite(float(info["epsilon"])) else info  # as every report writes ∞
    (run_dir / SELECTION_FILE).write_text(json.dumps(shown, default=str))
    return info


def selected_row(row: dict[str, Any], run_dir: Path, info: dict[str, Any], *, grid_size: int, eta: float, mean: float,
                 target: float) -> dict[str, Any]:  # fmt: skip
    """The released row of a selected run: its metrics on the report half only, both ε, what is composed."""
    summary = json.loads((run_dir / "summary.json").read_text())
    for k in summary.get("final", {}):
        row.pop(k, None)  # the full test split's values include the selection half
    row.update(info["report_metrics"])
    row["per_run_epsilon"] = row.get("epsilon")
    if row.get("adversaries"):
        row["adversaries"] = f"per run: {row['adversaries']}"  # the run's own ledger; the selection's ε is `epsilon`
    row["per_run_target_epsilon"] = info["per_run_target_epsilon"]
    row["target_epsilon"] = target
    row["epsilon"] = info["epsilon"] if math.isfinite(float(info["epsilon"])) else "inf"
    row["selection"] = (f"private: best of K ~ truncated negative binomial (η {eta:g}, mean {mean:g}; K secret) over "
                        f"{grid_size} candidate(s) by {info['select_metric']} on {info['selection_rows']} test rows")  # fmt: skip
    row["selected"] = " ".join(info["selected"])
    row["metrics_on"] = "the report half of the test split (disjoint from the selection rows)"
    row["composed"] = COMPOSED
    return row
