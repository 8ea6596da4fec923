"""``report.png`` and ``report.html`` agree on ε: both name the released model's ε (the observer's, what the run's
``summary.json`` reports), beside the run's target when the two differ. A FedALC run with only the W step's
``privacy.instance`` releases a model with ε = ∞ (client training is un-noised): both pages say ∞ (with the unit's
target beside it), and the page's plots place the run at ∞, not at the unit's target; a run whose θ and W are
covered shows its ε on both."""

from __future__ import annotations

import html
import math
import re

import pytest

from secure_fed.html_report import plotted_epsilon, run_row
from secure_fed.report import report_figure
from secure_fed.report_columns import epsilon_label
from tests.config.test_bad_input import cli
from tests.conftest import SMALL
from tests.test_privacy_lines import COVERED, W_STEP_ONLY


@pytest.mark.parametrize(("released", "target", "text"), [
    (3.998, 4.0, "4.0"), (1.846, 2.0, "1.8 (target 2.0)"), (math.inf, 2.0, "∞ (unit target 2.0)"),
    (math.inf, math.inf, "∞"), (None, 4.0, "4.0"), ("inf", None, "∞"),
])  # fmt: skip
def test_epsilon_label(released, target, text):
    assert epsilon_label(released, target) == text


def _page_epsilons(page: str) -> set[str]:
    """Every ε the page's plots write in a legend (``… ε = X`` in an SVG text element)."""
    return {m.strip() for m in re.findall(r"ε = ([^<]+)</text>", html.unescape(page))}


@pytest.mark.parametrize(
    ("name", "overrides", "expected"), [("wstep", W_STEP_ONLY, "∞ (unit target 2.0)"), ("covered", COVERED, None)]
)
def test_report_png_and_report_html_name_the_same_epsilon(tmp_path, name, overrides, expected):
    run = tmp_path / name
    code, _, err = cli("run", *[x for s in [*SMALL, "training.rounds=2", *overrides] for x in ("--set", s)], "--out", str(run))
    assert code == 0, err
    code, out, err = cli("report", str(run))
    assert code == 0 and (run / "report.png").is_file() and (run / "report.html").is_file(), err
    fig, rows, _ = report_figure([run])  # the figure report.png is drawn from
    png = {t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()}
    assert len(png) == 1
    png_eps = re.fullmatch(rf"{name} \(ε = (.+)\)", png.pop()).group(1)
    page_eps = _page_epsilons((run / "report.html").read_text())
    assert page_eps == {png_eps}, (page_eps, png_eps)
    row = run_row(run)
    if expected is not None:  # the released model's ε is ∞: the page's plots put the run at ∞, not at its unit's target
        assert png_eps == expected and row["target_epsilon"] == 2.0 and plotted_epsilon(row) == math.inf
    else:
        assert math.isfinite(row["epsilon"]) and png_eps == "2.0" and plotted_epsilon(row) == 2.0
