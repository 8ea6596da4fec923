"""report.html in a real headless browser (Chromium through Selenium): it renders with no console error, every
plot is drawn, the table has one row per run and sorts when a header is clicked; on a trade-off study's page the
plots' parts are found and measured as drawn (a curve, its seed band, legend entries naming ε, the attack AUC's CI
bars). Screenshots are saved as artifacts (``$SECURE_FED_ARTIFACTS``, default ``test-artifacts/`` in the repository).

The browser comes from the Debian packages (``apt-get install chromium chromium-driver``, in the README's test
set-up). Without it the test fails under ``CI=true`` and is skipped elsewhere."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from secure_fed.config import load_plan
from secure_fed.html_report import html_report, run_row
from tests.conftest import SMALL

REPO = Path(__file__).resolve().parents[1]


def _browser(width: int = 1400):
    """Headless Chromium through Selenium, its window ``width`` px wide; fails under ``CI=true`` without the browser."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        msg = "Chromium and chromedriver are needed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + ": CI must have the browser")
        pytest.skip(msg)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--window-size={width},1000"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Three small runs: two DP seeds at ε = 4 and one without DP, each audited by membership inference."""
    from secure_fed.engine import Experiment
    from threat_models.audit import audit
    from threat_models.context import AuditContext

    tmp_path = tmp_path_factory.mktemp("runs")
    runs = []
    for name, extra in (("dp4-seed0", ["seed=0"]), ("dp4-seed1", ["seed=1"]), ("nodp-seed0", ["protocols=[]"])):
        ov = [*SMALL, "training.rounds=2", "algorithm.name=fedaws", "attacks.run=[membership_inference]",
              "attacks.membership_inference.shadows=0"]  # fmt: skip
        if name.startswith("dp"):
            ov += [
                "protocols=[dp]",
                'privacy.local={"target_epsilon": 4, "batch_sample_rate": 0.5, "max_labels_per_instance": 8}',
            ]
        exp = Experiment(load_plan(overrides=[*ov, *extra]), run_dir=tmp_path / name)
        exp.run(progress=False)
        audit(AuditContext(exp), progress=False)
        runs.append(tmp_path / name)
    return runs


def test_rows_carry_the_target_the_accountant_and_the_attacks(runs):
    rows = [run_row(r, operator=True) for r in runs]
    assert [r["target_epsilon"] for r in rows] == [4.0, 4.0, math.inf]
    assert all(0 < r["epsilon"] <= 4 for r in rows[:2]) and math.isinf(rows[2]["epsilon"])
    # the audit's results: read from each run's private/attacks.json, in operator-only columns
    assert all((r / "private" / "attacks.json").is_file() and not (r / "attacks.json").exists() for r in runs)
    assert all(0.0 <= r["operator.membership_inference.loss.auc"] <= 1.0 for r in rows)
    assert rows[0]["operator.membership_inference.loss.auc.chance"] == 0.5
    # a released row (the default) has none of them
    assert all(not any("membership_inference" in k for k in run_row(r)) for r in runs)


def test_operator_columns_stay_out_of_released_tables_and_pages(tmp_path, runs):
    from secure_fed.html_report import released, write_csv

    rows = [run_row(r, operator=True) for r in runs]
    with pytest.raises(ValueError, match="operator-only"):
        write_csv(rows, tmp_path / "results.csv")
    with pytest.raises(ValueError, match="operator-only"):
        html_report(runs, tmp_path / "report.html", rows=rows)
    assert not (tmp_path / "results.csv").exists() and not (tmp_path / "report.html").exists()
    write_csv([released(r) for r in rows], tmp_path / "results.csv")
    assert "membership_inference" not in (tmp_path / "results.csv").read_text()
    (tmp_path / "private").mkdir()
    page = html_report(runs, tmp_path / "private" / "report.html", operator=True).read_text()
    assert "operator.membership_inference.loss.auc" in page and "operator-only" in page


def test_a_run_in_progress_shows_its_ledger_not_infinity(tmp_path, runs):
    """No summary.json yet: the row takes ε from the last metrics line (never ∞ for a DP run)."""
    live = tmp_path / "live"
    live.mkdir()
    for f in ("config.yaml", "metrics.jsonl"):
        (live / f).write_text((runs[0] / f).read_text())
    row = run_row(live)
    last = [ln for ln in (runs[0] / "metrics.jsonl").read_text().splitlines() if ln.strip()][-1]
    assert row["status"] == "running" and row["epsilon"] == pytest.approx(json.loads(last)["privacy"]["epsilon"])
    assert math.isfinite(row["epsilon"]) and row["target_epsilon"] == 4.0


def test_report_html_renders_in_a_headless_browser(tmp_path, runs):
    (tmp_path / "private").mkdir()  # the operator's page (with the attack plots) goes under private/
    page = html_report(runs, tmp_path / "private" / "report.html", title="browser test", operator=True)
    driver = _browser()
    try:
        driver.get(page.as_uri())
        assert driver.title == "browser test"
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        plots = driver.execute_script(
            "return Array.from(document.querySelectorAll('figure svg')).map(s => s.getBoundingClientRect().width);"
        )
        assert len(plots) >= 3 and all(w > 100 for w in plots), plots
        rows = driver.execute_script("return document.querySelectorAll('#runs tbody tr').length;")
        assert rows == len(runs)
        # sorting: click the ε header twice; the first and last rows swap between ascending and descending
        header = driver.execute_script(
            "return Array.from(document.querySelectorAll('#runs th')).find(h => h.textContent === 'epsilon');"
        )
        first = "return document.querySelector('#runs tbody tr').cells[0].textContent;"
        header.click()
        asc = driver.execute_script(first)
        header.click()
        desc = driver.execute_script(first)
        assert asc != desc and desc == "nodp-seed0"  # ε = ∞ sorts last ascending, first descending
        art = Path(os.environ.get("SECURE_FED_ARTIFACTS", REPO / "test-artifacts"))
        art.mkdir(parents=True, exist_ok=True)
        driver.execute_script("window.scrollTo(0, 0);")
        assert driver.save_screenshot(str(art / "report_html.png"))
        assert (art / "report_html.png").stat().st_size > 10_000
    finally:
        driver.quit()


#: the plots' parts as drawn: (figure, its parts' group-id prefix) → [drawn width, drawn height] of each part
_PARTS = """
const out = {};
for (const fig of document.querySelectorAll('figure[data-plot]')) {
  const parts = {};
  for (const g of fig.querySelectorAll('svg g[id]')) {
    const kind = g.id.split('-')[0];
    if (!['curve', 'band', 'cibar', 'legend'].includes(kind)) continue;
    const r = g.getBoundingClientRect();
    (parts[kind] = parts[kind] || []).push({w: r.width, h: r.height, paths: g.querySelectorAll('path').length,
                                           text: Array.from(g.querySelectorAll('text')).map(t => t.textContent)});
  }
  out[fig.dataset.plot] = parts;
}
return out;
"""


def test_tradeoff_page_shows_the_curve_its_seed_bands_epsilon_legends_and_ci_bars(tmp_path):
    """A trade-off study's operator page (two methods × ε ∈ {1, 4, ∞} × two seeds, each run audited) in Chromium:
    a screenshot, then the structure as drawn: each method's curve and its seed band (with height: the seeds differ),
    legend entries naming ε and the band, one CI bar per run on the attack plot."""
    from tests.report_runs import fake_run

    grid = [(m, e, s) for m in ("fedaws", "fedalc") for e in (1.0, 4.0, math.inf) for s in (0, 1)]
    runs = [fake_run(tmp_path, f"{m}-{e}-{s}", eps=e, seed=s, method=m, p1=40 + 3 * s + (10 if math.isinf(e) else e),
                     auc=0.52 + 0.02 * s) for m, e, s in grid]  # fmt: skip
    (tmp_path / "private").mkdir()
    page = html_report(runs, tmp_path / "private" / "report.html", title="trade-off", operator=True)
    driver = _browser()
    try:
        driver.get(page.as_uri())
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, errors
        art = Path(os.environ.get("SECURE_FED_ARTIFACTS", REPO / "test-artifacts"))
        art.mkdir(parents=True, exist_ok=True)
        assert driver.save_screenshot(str(art / "tradeoff_html.png"))
        assert (art / "tradeoff_html.png").stat().st_size > 10_000
        parts = driver.execute_script(_PARTS)
        util = parts["utility_vs_epsilon.png"]
        assert len(util["curve"]) == 2 and all(c["paths"] and c["w"] > 50 for c in util["curve"])
        assert len(util["band"]) == 2 and all(b["paths"] and b["w"] > 50 for b in util["band"])
        # the band has a thickness: the seeds' spread, drawn taller than its curve (whose markers stick out of a line)
        assert all(b["h"] > c["h"] + 20 for b, c in zip(util["band"], util["curve"], strict=True)), util
        (legend,) = util["legend"]
        assert sum("ε = 1.0, 4.0, ∞" in t for t in legend["text"]) == 2
        assert sum("seed min–max" in t for t in legend["text"]) == 2 and legend["w"] > 0
        attack = parts["attack_membership_inference_loss_auc_vs_epsilon.png"]
        assert sum(b["paths"] for b in attack["cibar"]) == len(runs) and all(b["h"] > 5 for b in attack["cibar"])
        assert any("95% CI" in t for t in attack["legend"][0]["text"])
        (legend,) = parts["metric_vs_round.png"]["legend"]
        assert len(legend["text"]) == 6 and all("ε = " in t for t in legend["text"])
    finally:
        driver.quit()
