"""What the report's plots and table say, checked on their structure: ε in every legend, the curve in its seed band,
each run's attack AUC with its CI bar, the columns in groups, ε written ``4.0`` / ``∞``; ``secure-fed run`` leaves
``report.png`` in its run directory. (The same page in a real browser: ``tests/test_html_report.py``.)"""

from __future__ import annotations

import csv
import math
import re
import xml.etree.ElementTree as ET

import pytest

from secure_fed.html_report import html_report, run_row, write_csv
from secure_fed.report import report_figure
from secure_fed.report_columns import format_epsilon
from tests.config.test_bad_input import cli
from tests.conftest import SMALL
from tests.report_runs import fake_run

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize(("v", "text"), [(3.9980538230188847, "4.0"), (math.inf, "∞"), ("inf", "∞"), (12.25, "12.2"),
                                         (0.5234, "0.52"), (0.9995, "1.0"), (0.994, "0.99"), (None, "?")])  # fmt: skip
def test_epsilon_is_written_for_a_reader(v, text):
    assert format_epsilon(v) == text


@pytest.fixture
def study(tmp_path):
    """Two methods × ε ∈ {1, 4, ∞} × 2 seeds, each run audited (an AUC and its CI)."""
    runs = []
    for method in ("fedaws", "fedalc"):
        for eps in (1.0, 4.0, math.inf):
            for seed in (0, 1):
                p1 = 40 + 2 * seed + (10 if math.isinf(eps) else eps)
                runs.append(fake_run(tmp_path, f"{method}-{eps}-{seed}", eps=eps, seed=seed, method=method, p1=p1,
                                     auc=0.5 + 0.01 * (seed + 1)))  # fmt: skip
    return runs


def _figures(page: str) -> dict[str, ET.Element]:
    figs = re.findall(r'<figure data-plot="([^"]+)">(<svg.*?</svg>)', page, flags=re.S)
    return {name: ET.fromstring(svg) for name, svg in figs}


def _group(svg: ET.Element, prefix: str) -> list[ET.Element]:
    return [g for g in svg.iter(f"{SVG}g") if g.get("id", "").startswith(prefix)]


def _legend(svg: ET.Element) -> list[str]:
    (leg,) = _group(svg, "legend")
    return ["".join(t.itertext()) for t in leg.iter(f"{SVG}text")]


def test_the_utility_curve_sits_in_its_seed_band_and_the_legend_names_epsilon(tmp_path, study):
    (tmp_path / "private").mkdir()
    page = html_report(study, tmp_path / "private" / "report.html", operator=True).read_text()
    figs = _figures(page)
    util = figs["utility_vs_epsilon.png"]
    curves, bands = _group(util, "curve-"), _group(util, "band-")
    assert len(curves) == 2 and len(bands) == 2  # one curve and one band per method
    assert all(list(g.iter(f"{SVG}path")) for g in curves + bands)
    legend = _legend(util)
    assert sum("ε = 1.0, 4.0, ∞" in t for t in legend) == 2 and sum("seed min–max" in t for t in legend) == 2
    assert "band: seed min–max" in page  # said in the caption too
    # the attack's AUC: one CI bar per run, the chance line in the legend
    attack = figs["attack_membership_inference_loss_auc_vs_epsilon.png"]
    bars = _group(attack, "cibar-")
    assert len(bars) == 2 and sum(len(list(g.iter(f"{SVG}path"))) for g in bars) == len(study)
    assert any("95% CI" in t for t in _legend(attack)) and "chance" in _legend(attack)
    # by round: every (method, ε) line names its ε
    assert sorted(t for t in _legend(figs["metric_vs_round.png"])) == sorted(
        f"{m}, ε = {e}" for m in ("fedaws", "fedalc") for e in ("1.0", "4.0", "∞")
    )


def test_the_band_spans_the_seeds(tmp_path, study):
    """The band's vertical extent is the seeds' min–max of the metric (in data units, read back from matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from secure_fed.html_report import _eps_plot

    rows = [run_row(r) for r in study]
    fig = _eps_plot(plt, rows, "P@1", ylabel="P@1", title="t")
    (ax,) = fig.axes
    bands = [c for c in ax.collections if (c.get_gid() or "").startswith("band-")]
    ys = sorted({round(float(y), 6) for b in bands for p in b.get_paths() for y in p.vertices[:, 1]})
    seeds = sorted({round(r["P@1"], 6) for r in rows})
    assert ys == seeds  # every seed's value is a band edge, and nothing else is
    plt.close(fig)


def test_every_panel_of_report_png_names_each_runs_epsilon(tmp_path):
    runs = [fake_run(tmp_path, "dp", eps=4.0, lam=1.0), fake_run(tmp_path, "nodp", lam=100.0)]
    fig, rows, _ = report_figure(runs, vary=("algorithm.lam",), warning="the runs differ")
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
    assert len(legends) == 4 and all(
        texts == ["dp (ε = 4.0, algorithm.lam = 1.0)", "nodp (ε = ∞, algorithm.lam = 100.0)"] for texts in legends
    )
    assert fig._suptitle.get_text() == "warning: the runs differ"


def test_the_table_groups_its_columns_and_writes_epsilon_and_the_cis(tmp_path, study):
    (tmp_path / "private").mkdir()
    rows = [run_row(r, operator=True) for r in study[:3]]
    page = html_report(study[:3], tmp_path / "private" / "report.html", rows=rows).read_text()
    groups = re.search(r'<tr class="groups">(.*?)</tr>', page).group(1)
    assert re.findall(r">(\w+)</th>", groups) == ["setup", "privacy", "utility", "attacks"]
    cols = re.findall(r"<th>([^<]+)</th>", re.search(r'<tr class="cols">(.*?)</tr>', page).group(1))
    assert cols[:12] == ["run", "method", "seed", "status", "rounds", "unit", "target_epsilon", "epsilon", "delta", "sigma",
                         "accountant", "adversaries"]  # fmt: skip
    first = re.search(r"<tbody><tr>(.*?)</tr>", page).group(1)
    assert ">4.0</td>" not in first and ">1.0</td>" in first  # ε = 0.9995 written 1.0, not 0.9995
    assert ">observer 1.0; server ∞</td>" in first and ">[0.470, 0.560]</td>" in first
    write_csv(rows, tmp_path / "private" / "results.csv")
    (row, *_) = csv.DictReader((tmp_path / "private" / "results.csv").open())
    assert row["operator.membership_inference.loss.auc_ci95"] == "[0.470, 0.560]" and row["unit"] == "instance"


def test_run_writes_report_png_into_its_run_directory(tmp_path):
    sets = [x for s in SMALL for x in ("--set", s)]
    code, out, err = cli("run", *sets, "--set", "training.rounds=2", "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert (tmp_path / "r" / "report.png").stat().st_size > 1000
