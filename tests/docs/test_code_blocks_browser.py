"""No code block on the docs' main pages is cut at a 1280 px window: the site is built (``mkdocs build --strict``) and
each page opened in headless Chromium (the browser of ``tests/test_html_report.py``: without it the test fails under
``CI=true`` and is skipped elsewhere). For every ``<pre>`` and the ``<code>`` inside it, what is drawn must fit
(``scrollWidth ≤ clientWidth``): a long command wraps (``docs/assets/code-wrap.css``) instead of hiding its end
behind a scroll bar."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.test_html_report import _browser

WIDTH = 1280
#: the pages a newcomer reads first: home, getting started, recipes, and every results page
PAGES = ["", "getting-started/", "recipes/", "results/privacy-utility/", "results/fedalc-table-vi/",
         "results/general-multilabel/"]  # fmt: skip

#: every <pre> of the page with its inner <code>: their widths as drawn
_WIDTHS = """
return [...document.querySelectorAll('.md-content pre')].map((pre, i) => {
  const code = pre.querySelector('code') || pre;
  return {i, text: pre.innerText.slice(0, 80), pre: [pre.scrollWidth, pre.clientWidth],
          code: [code.scrollWidth, code.clientWidth], shown: pre.getClientRects().length > 0};
});
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out


def test_no_code_block_is_cut_at_1280_px(site):
    driver = _browser(WIDTH)
    try:
        assert driver.execute_script("return window.innerWidth") == WIDTH
        cut, seen = {}, 0
        for page in PAGES:
            driver.get((site / page / "index.html").as_uri())
            blocks = [b for b in driver.execute_script(_WIDTHS) if b["shown"]]
            assert blocks, page  # every page checked has code blocks
            seen += len(blocks)
            bad = [b for b in blocks if b["pre"][0] > b["pre"][1] or b["code"][0] > b["code"][1]]
            if bad:
                cut[page or "home"] = bad
        assert seen >= 20 and cut == {}, cut
    finally:
        driver.quit()
