"""A self-contained HTML page that compares runs: one table row per run, plots embedded.

``secure-fed report RUN…`` and ``secure-fed tradeoff`` write the same page (``report.html``): no network, no
external file — the plots are inline SVG (their curves, bands, error bars and legends are elements a browser test
finds: ``curve-…``, ``band-…``, ``cibar-…``, ``legend``), the table (its columns grouped: setup, privacy, utility,
attacks; ε written ``4.0`` / ``∞``) sorts with a few lines of inline script (click
a column header), and a filter box narrows the rows. Each run contributes what its released files hold:
``summary.json`` (method, seed, status, ε, δ, σ, the ledger's target ε, final metrics) and ``config.yaml`` (seed,
protocols; for a run in progress, the target ε its accounting layer's spec reads there: ``LayerSpec.target_epsilons``).
The operator's page (``operator=True``) adds, when an audit ran, ``private/attacks.json``: each attack's metrics with their
confidence intervals and the audit's ε lower bound, computed from the members, in columns named ``operator.…``
(:data:`~secure_fed.run_files.OPERATOR_PREFIX`); a page or table with such columns is operator-only and is written
under a ``private/`` directory, never beside the released files.

Plots, where the runs have what they need:

* utility vs ε, one line per method, mean over seeds with a seed min–max band (ε = ∞ at the right end);
* (operator) attack success vs ε against the attack's chance level, each run's 95% CI as an error bar;
* (operator) the one-run audit's ε lower bound against the accountant's ε (it must stay under the diagonal);
* a metric against the round, one line per (method, ε), mean over seeds.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from secure_fed.errors import SecureFedError
from secure_fed.plugin_specs import layer_specs
from secure_fed.report_columns import EPSILON_COLUMNS, column_groups, columns, epsilon_label, format_epsilon
from secure_fed.run_files import ATTACKS_RECORD, OPERATOR_PREFIX, PRIVACY_RECORD, PRIVATE_DIR, attacks_path
from secure_fed.run_history import load_run

OPERATOR_DIR = PRIVATE_DIR
OPERATOR_NOTE = ("operator-only: the operator.… columns and the attack plots are computed from the members (each run's "
                 "private/attacks.json); do not release this page")  # fmt: skip

#: metrics preferred as "utility" on the plots, in order (the first one the runs have)
UTILITY_KEYS = ("P@1", "mAP", "GmAP", "C-F1")


def _num(v: Any) -> float:
    if v in (None, "", "inf"):
        return math.inf if v == "inf" else math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _accounting_targets(cfg: dict[str, Any]) -> dict[str, float] | None:
    """The target ε by privacy unit that the settings of the run's accounting layers set (their specs'
    ``target_epsilons``, read from config.yaml as plain data); None when no listed layer accounts privacy."""
    specs = layer_specs()
    hooks = [specs[n].target_epsilons for n in cfg.get("protocols") or [] if n in specs and specs[n].target_epsilons]
    if not hooks:
        return None
    return {unit: t for hook in hooks for unit, t in hook(cfg).items()}


def _target_epsilon(priv: dict[str, Any], cfg: dict[str, Any]) -> float:
    """The run's target ε on its privacy unit (∞ without DP; the accountant's ε if no target was set): the target the
    ledger released (``summary.json``), else, for a run in progress, the one its accounting layers' settings set."""
    targets = _accounting_targets(cfg)
    if "unit" not in priv and targets is None:  # no privacy unit in the ledger, and no layer that accounts one
        return math.inf
    unit = priv.get("unit", "instance")
    released = priv.get("units", {}).get(unit, {})
    target = released["target_epsilon"] if "target_epsilon" in released else (targets or {}).get(unit)
    return float(target) if target is not None else _num(priv.get("epsilon"))


def run_row(run_dir: Path, *, method: str | None = None, operator: bool = False) -> dict[str, Any]:
    """One table row for a run directory: what its released files say; with ``operator``, also its audit's results
    (``private/attacks.json``) in ``operator.…`` columns."""
    history, summary = load_run(run_dir)
    summary = summary or {}
    cfg_path = run_dir / "config.yaml"
    try:
        cfg = (yaml.safe_load(cfg_path.read_text()) if cfg_path.is_file() else {}) or {}
    except yaml.YAMLError:
        raise SecureFedError(f"{cfg_path}: not valid YAML") from None
    priv = summary.get(PRIVACY_RECORD)
    if priv is None:  # a run still in progress (or stopped before its summary): its last metrics line's ledger
        lines = [x for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
        try:
            priv = json.loads(lines[-1]).get(PRIVACY_RECORD, {}) if lines else {}
        except json.JSONDecodeError:  # the line a running run is writing: the ledger as of the line before
            priv = json.loads(lines[-2]).get(PRIVACY_RECORD, {}) if len(lines) > 1 else {}
    dp = "unit" in priv or _accounting_targets(cfg) is not None  # the ledger has a unit, or a listed layer accounts
    unit = priv.get("units", {}).get(priv.get("unit", ""), {})
    sigmas = unit.get("mechanisms", {})
    sigma = ";".join(f"{m['noise_multiplier']:.4g}" for m in sigmas.values()) if sigmas else unit.get("noise_multiplier")
    row: dict[str, Any] = {
        "run": run_dir.name,
        "method": method or summary.get("algorithm") or (cfg.get("algorithm") or {}).get("name", "?"),
        "seed": cfg.get("seed"),
        "status": summary.get("status", "running"),
        "rounds": summary.get("rounds_completed", history[-1]["round"] if history else 0),
        "target_epsilon": _target_epsilon(priv, cfg),
        "epsilon": _num(priv.get("epsilon", "inf" if not dp else None)),
        "delta": priv.get("delta"),
        "sigma": sigma,
        "unit": priv.get("unit"),
        "accountant": unit.get("accountant"),
        "adversaries": "; ".join(f"{name} {format_epsilon(a.get('epsilon'))}" for name, a in unit.get("adversaries", {}).items())
        or None,
    }
    per_round = ("round", PRIVACY_RECORD)
    final = summary.get("final") or ({k: v for k, v in history[-1].items() if k not in per_round} if history else {})
    row.update({k: v for k, v in final.items() if isinstance(v, (int, float))})
    if isinstance(summary.get("W_mean_cos"), (int, float)):
        row["W_mean_cos"] = summary["W_mean_cos"]
    if operator:
        row.update(operator_columns(run_dir))
    row["run_dir"] = str(run_dir)
    return row


def operator_columns(run_dir: Path) -> dict[str, Any]:
    """The run's audit results (``private/attacks.json``, computed from the members) as ``operator.…`` columns;
    none when no audit ran."""
    attacks = attacks_path(run_dir)
    if not attacks.is_file():
        return {}
    try:
        doc = json.loads(attacks.read_text())
    except json.JSONDecodeError:
        raise SecureFedError(f"{attacks}: not valid JSON") from None
    row: dict[str, Any] = {}
    for name, res in doc.get(ATTACKS_RECORD, {}).items():
        col = f"{OPERATOR_PREFIX}{name}"
        if "skipped" in res:
            row[f"{col}.skipped"] = res["skipped"]
        for key, val in _flatten(res.get("metrics", {})).items():
            row[f"{col}.{key}"] = val
        for key, val in _flatten(res.get("chance", {})).items():
            row[f"{col}.{key}.chance"] = val
    return row


def released(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without its operator-only columns: what a released table may hold."""
    return {k: v for k, v in row.items() if not k.startswith(OPERATOR_PREFIX)}


def has_operator_columns(rows: list[dict[str, Any]]) -> bool:
    """Whether any row holds an operator-only column (``operator.…``: computed from the members, never released)."""
    return any(k.startswith(OPERATOR_PREFIX) for r in rows for k in r)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v):
            out[key] = (float(v[0]), float(v[1]))  # a confidence interval
        elif isinstance(v, (int, float, str, bool)) or v is None:
            out[key] = v
    return out


def write_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    """The rows as CSV; one with operator-only columns must be written under a ``private/`` directory."""
    if has_operator_columns(rows) and OPERATOR_DIR not in path.parent.parts:
        raise ValueError(f"{path}: a table with operator-only columns goes under a {OPERATOR_DIR}/ directory")
    cols = _columns(rows)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: _csv_value(r.get(k, "")) for k in cols})
    return path


def _csv_value(v: Any) -> Any:
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, tuple):
        return _interval(v)
    return v


def _interval(v: tuple[float, float]) -> str:
    return f"[{v[0]:.3f}, {v[1]:.3f}]"


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    return columns(rows)


# ------------------------------------------------------------------------------------------------ plots
#: how the bands of the ε plots are computed (said in their legends, titles and the page)
BAND = "seed min–max"


def _eps_x(values: list[float]) -> tuple[dict[float, float], list[float], list[str]]:
    """x positions for ε values: log scale, ∞ one step beyond the largest finite ε."""
    finite = sorted({v for v in values if math.isfinite(v) and v > 0})
    pos = {v: v for v in finite}
    ticks, labels = list(finite), [format_epsilon(v) for v in finite]
    if any(math.isinf(v) for v in values):
        inf_x = (finite[-1] * 2.0) if finite else 1.0
        pos[math.inf] = inf_x
        ticks.append(inf_x)
        labels.append("∞")
    return pos, ticks, labels


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _svg(plt, fig) -> str:
    """The figure as an inline ``<svg>`` element: text kept as text (legends searchable), the plot's parts as groups
    with ids (``curve-…``, ``band-…``, ``cibar-…``, ``legend``) that a browser test can find."""
    buf = io.StringIO()
    with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "secure-fed"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _utility_key(rows: list[dict[str, Any]]) -> str | None:
    return next((k for k in UTILITY_KEYS if any(isinstance(r.get(k), (int, float)) for r in rows)), None)


def plotted_epsilon(row: dict[str, Any]) -> float:
    """Where a run sits on the page's ε axes: its target ε, or ∞ when the released model's ε is ∞ (a unit whose
    target covers only part of the run, e.g. W's label-set step alone, does not place the model at its target), so
    that the page and ``report.png`` (whose legends name the released model's ε) agree."""
    return math.inf if math.isinf(_num(row.get("epsilon"))) else row["target_epsilon"]


def point_label(rows: list[dict[str, Any]]) -> str:
    """The ε of the runs at one point of a plot, as :func:`~secure_fed.report_columns.epsilon_label` writes it: the
    largest released ε among them (the bound that holds for each), beside their target when that differs."""
    released = [e for r in rows if not math.isnan(e := _num(r.get("epsilon")))]
    targets = {r["target_epsilon"] for r in rows}
    return epsilon_label(max(released) if released else None, targets.pop() if len(targets) == 1 else None)


def _by_method_eps(rows, key) -> dict[str, dict[float, list[dict[str, Any]]]]:
    out: dict[str, dict[float, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if math.isfinite(_num(r.get(key))):
            out[r["method"]][plotted_epsilon(r)].append(r)
    return out


def _legend(ax, **kw) -> None:
    ax.legend(**kw).set_gid("legend")


def _eps_plot(plt, rows, key, *, ylabel, title, chance_key=None, ci_key=None):
    """``key`` against the target ε, one curve per method (the mean over seeds) in its seed min–max band; with
    ``ci_key``, each run's value with its confidence interval as an error bar."""
    groups = _by_method_eps(rows, key)
    if not groups:
        return None
    pos, ticks, labels = _eps_x([plotted_epsilon(r) for r in rows])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (method, by_eps) in enumerate(sorted(groups.items())):
        eps = sorted(e for e in by_eps if e in pos)
        xs = [pos[e] for e in eps]
        vals = [[_num(r[key]) for r in by_eps[e]] for e in eps]
        seeds = max(len(v) for v in vals)
        shown = ", ".join(point_label(by_eps[e]) for e in eps)
        (line,) = ax.plot(xs, [sum(v) / len(v) for v in vals], marker="o",
                          label=f"{method}: mean over {seeds} seed(s), ε = {shown}")  # fmt: skip
        line.set_gid(f"curve-{i}")
        band = ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals], alpha=0.2, color=line.get_color(),
                               label=f"{method}: {BAND} over seeds")  # fmt: skip
        band.set_gid(f"band-{i}")
        if ci_key:
            pts = [(pos[e] * (1 + 0.04 * (j - (len(by_eps[e]) - 1) / 2)), _num(r[key]), r.get(ci_key))
                   for e in eps for j, r in enumerate(by_eps[e])]  # fmt: skip
            pts = [(x, y, ci) for x, y, ci in pts if isinstance(ci, (tuple, list)) and len(ci) == 2]
            if pts:
                err = [[max(y - ci[0], 0.0) for _, y, ci in pts], [max(ci[1] - y, 0.0) for _, y, ci in pts]]
                bars = ax.errorbar([p[0] for p in pts], [p[1] for p in pts], yerr=err, fmt="none", capsize=3,
                                   color=line.get_color(), label=f"{method}: each run's 95% CI")  # fmt: skip
                bars.lines[2][0].set_gid(f"cibar-{i}")
    if chance_key:
        ch = [_num(r.get(chance_key)) for r in rows if math.isfinite(_num(r.get(chance_key)))]
        if ch:
            ax.axhline(ch[0], color="grey", ls="--", label="chance")
    if ticks:
        ax.set_xscale("log")
        ax.set_xticks(ticks, labels)
        ax.minorticks_off()
    ax.set(xlabel="target ε (∞: the released model's ε is ∞)", ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=7)
    fig.tight_layout()
    return fig


def _audit_plot(plt, rows):
    """Every audit's ε lower bound (an attack result's ``epsilon_lower_bound``, e.g. the one-run audit's) against the
    accountant's ε, one series per method (and attack, where several report a bound)."""
    bounds = sorted({k for r in rows for k in r if k.startswith(OPERATOR_PREFIX) and k.endswith(".epsilon_lower_bound")})

    def series(r, k):
        return r["method"] if len(bounds) == 1 else f"{r['method']} ({k.removeprefix(OPERATOR_PREFIX).split('.')[0]})"

    pts = [(_num(r.get("epsilon")), _num(r.get(k)), series(r, k)) for k in bounds for r in rows]
    pts = [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(5.0, 3.8))
    for method in sorted({p[2] for p in pts}):
        mine = [p for p in pts if p[2] == method]
        ax.scatter([p[0] for p in mine], [p[1] for p in mine], label=method)
    top = max(max(p[0] for p in pts), max(p[1] for p in pts), 1e-3) * 1.1
    ax.plot([0, top], [0, top], color="grey", ls="--", label="lower bound = accountant ε")
    ax.set(xlabel="accountant ε", ylabel="audit ε lower bound (one run)", title="one-run audit vs accountant")
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=8)
    fig.tight_layout()
    return fig


def _round_plot(plt, rows, key):
    curves: dict[tuple[str, float], list[list[tuple[int, float]]]] = defaultdict(list)
    at: dict[tuple[str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        history, _ = load_run(Path(r["run_dir"]))
        pts = [(h["round"], float(h[key])) for h in history if isinstance(h.get(key), (int, float))]
        if pts:
            curves[(r["method"], plotted_epsilon(r))].append(pts)
            at[(r["method"], plotted_epsilon(r))].append(r)
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for i, ((method, eps), runs) in enumerate(sorted(curves.items(), key=lambda kv: (kv[0][0], kv[0][1]))):
        by_round: dict[int, list[float]] = defaultdict(list)
        for pts in runs:
            for rd, v in pts:
                by_round[rd].append(v)
        rounds = sorted(by_round)
        (line,) = ax.plot(rounds, [sum(by_round[x]) / len(by_round[x]) for x in rounds], marker=".",
                          label=f"{method}, ε = {point_label(at[(method, eps)])}")  # fmt: skip
        line.set_gid(f"curve-{i}")
    ax.set(xlabel="round", ylabel=key, title=f"{key} by round (mean over seeds)")
    ax.grid(alpha=0.3)
    _legend(ax, fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def make_plots(rows: list[dict[str, Any]]) -> list[tuple[str, str, bytes, str]]:
    """``(file name, title, PNG bytes, inline SVG)`` for every plot the rows support."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    util = _utility_key(rows)
    figs = []
    if util:
        figs.append(("utility_vs_epsilon.png", f"{util} vs ε (curve: mean over seeds; band: {BAND})",
                     _eps_plot(plt, rows, util, ylabel=util, title=f"utility ({util}) vs ε; band: {BAND}")))  # fmt: skip
    if util == "P@1" and any(isinstance(r.get("mAP"), (int, float)) for r in rows):  # ranking and per-label utility
        figs.append(("map_vs_epsilon.png", f"mAP vs ε (curve: mean over seeds; band: {BAND})",
                     _eps_plot(plt, rows, "mAP", ylabel="mAP", title=f"utility (mAP) vs ε; band: {BAND}")))  # fmt: skip
    attack_keys = sorted({k for r in rows for k in r if k.endswith(".auc") and not k.endswith(".chance")})
    for k in attack_keys:
        name = k.removeprefix(OPERATOR_PREFIX)
        fig = _eps_plot(plt, rows, k, ylabel=name, title=f"attack success ({name}) vs ε; bars: 95% CI",
                        chance_key=f"{k}.chance", ci_key=f"{k}_ci95")  # fmt: skip
        figs.append((f"attack_{name.replace('.', '_')}_vs_epsilon.png",
                     f"{name} vs ε (bars: each run's 95% CI; band: {BAND}; operator-only)", fig))  # fmt: skip
    figs.append(("audit_vs_accountant.png", "audit lower bound vs accountant ε (operator-only)", _audit_plot(plt, rows)))
    if util:
        figs.append(("metric_vs_round.png", f"{util} by round", _round_plot(plt, rows, util)))
    for name, title, fig in figs:
        if fig is not None:
            out.append((name, title, _png(fig), _svg(plt, fig)))
            plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------------ page
_SCRIPT = """
function cellValue(td){const t=td.getAttribute('data-v');const n=t===''?NaN:Number(t);return isNaN(n)?t:n;}
function sortBy(th){const table=th.closest('table');const i=Array.from(th.parentNode.children).indexOf(th);
 const asc=th.getAttribute('data-asc')!=='1';th.parentNode.querySelectorAll('th').forEach(h=>h.removeAttribute('data-asc'));
 th.setAttribute('data-asc',asc?'1':'0');const body=table.tBodies[0];const rows=Array.from(body.rows);
 rows.sort((a,b)=>{const x=cellValue(a.cells[i]),y=cellValue(b.cells[i]);
  if(typeof x==='number'&&typeof y==='number')return asc?x-y:y-x;
  return asc?String(x).localeCompare(String(y)):String(y).localeCompare(String(x));});
 rows.forEach(r=>body.appendChild(r));}
function filterRows(box){const q=box.value.toLowerCase();document.querySelectorAll('#runs tbody tr').forEach(
 r=>{r.style.display=r.textContent.toLowerCase().includes(q)?'':'none';});}
document.querySelectorAll('#runs tr.cols th').forEach(th=>th.addEventListener('click',()=>sortBy(th)));
document.getElementById('filter').addEventListener('input',e=>filterRows(e.target));
"""

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222}
h1{font-size:1.4em} h2{font-size:1.1em;margin-top:1.6em}
.plots{display:flex;flex-wrap:wrap;gap:16px} figure{margin:0} figcaption{font-size:.85em;color:#555}
figure svg{max-width:100%;height:auto}
table{border-collapse:collapse;font-size:.82em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;position:sticky;top:0} tr.cols th{cursor:pointer;top:1.6em} tr.groups th{text-align:center}
th[data-asc='1']::after{content:' ▲'} th[data-asc='0']::after{content:' ▼'}
td.t{text-align:left} .wrap{max-height:70vh;overflow:auto} .note{color:#555;font-size:.9em;max-width:60em}
.warning{color:#b00020;font-weight:bold}
"""


def _cell(v: Any, column: str = "") -> tuple[str, str]:
    """(display text, sort value)."""
    if column in EPSILON_COLUMNS and isinstance(v, (int, float)) and not isinstance(v, bool):
        return format_epsilon(v), ("1e308" if math.isinf(v) else repr(float(v)))
    if isinstance(v, bool):
        return str(v), str(v)
    if isinstance(v, tuple):
        return _interval(v), repr(v[0])
    if isinstance(v, float):
        if math.isinf(v):
            return "∞", "1e308"
        if math.isnan(v):
            return "", ""
        return f"{v:.4g}", repr(v)
    if isinstance(v, int):
        return str(v), str(v)
    return ("" if v is None else str(v)), ("" if v is None else str(v))


def write_html(rows: list[dict[str, Any]], out: Path, *, title: str, plots: list[tuple[str, str, bytes, str]],
               notes: list[str] | None = None, warning: str | None = None) -> Path:  # fmt: skip
    """The self-contained page (``report.html``): the plots inline as SVG, the table's columns in groups."""
    groups = column_groups(rows)
    cols = [c for _, cs in groups for c in cs]
    group_head = "".join(f'<th colspan="{len(cs)}">{html.escape(g)}</th>' for g, cs in groups)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            text, key = _cell(r.get(c), c)
            cls = ' class="t"' if isinstance(r.get(c), str) else ""
            cells.append(f'<td{cls} data-v="{html.escape(key, quote=True)}">{html.escape(text)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    figs = "".join(
        f'<figure data-plot="{html.escape(name, quote=True)}">{svg}<figcaption>{html.escape(t)}</figcaption></figure>'
        for name, t, _, svg in plots
    )
    note = "".join(f'<p class="note">{html.escape(n)}</p>' for n in (notes or []))
    if warning:
        note = f'<p class="note warning" id="warning">warning: {html.escape(warning)}</p>' + note
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_STYLE}</style></head>
<body><h1>{html.escape(title)}</h1>{note}
<h2>Plots</h2><div class="plots">{figs or "<p>(no plot: the runs have no evaluated metric yet)</p>"}</div>
<h2>Runs ({len(rows)})</h2><p><input id="filter" type="search" placeholder="filter rows…"> click a column to sort</p>
<div class="wrap"><table id="runs"><thead><tr class="groups">{group_head}</tr><tr class="cols">{head}</tr></thead>
<tbody>{"".join(body)}</tbody></table></div>
<script>{_SCRIPT}</script></body></html>
"""
    out.write_text(page, encoding="utf-8")
    return out


def html_report(run_dirs: list[Path], out: Path, *, title: str = "secure-fed runs", methods: dict[str, str] | None = None,
                notes: list[str] | None = None, plots_dir: Path | None = None, rows: list[dict[str, Any]] | None = None,
                operator: bool = False, warning: str | None = None) -> Path:  # fmt: skip
    """Rows, plots and the page for ``run_dirs`` (``methods``: run dir → method label, default the algorithm; ``rows``:
    rows already built, e.g. with the swept target ε; ``operator``: with the audits' columns; ``warning``: the runs do
    not compare, said at the top). With ``plots_dir`` the PNGs are also written there as files. A page with
    operator-only columns must be written under ``private/``."""
    if rows is None:
        rows = [run_row(Path(d), method=(methods or {}).get(str(d)), operator=operator) for d in run_dirs]
    if has_operator_columns(rows):
        if OPERATOR_DIR not in out.parent.parts:
            raise ValueError(f"{out}: a page with operator-only columns goes under a {OPERATOR_DIR}/ directory")
        notes = [OPERATOR_NOTE, *(notes or [])]
    plots = make_plots(rows)
    if plots_dir is not None:
        plots_dir.mkdir(parents=True, exist_ok=True)
        for name, _, png, _ in plots:
            (plots_dir / name).write_bytes(png)
    return write_html(rows, out, title=title, plots=plots, notes=notes, warning=warning)
