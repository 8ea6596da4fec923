"""Every relative link in the README and the docs points at a file that exists, and at a heading of it when it
names an anchor. (`mkdocs build --strict` checks the site's own pages; this also covers the README and the links
from the docs to files outside them.)"""

from __future__ import annotations

from tests.conftest import REPO
from tests.docs.pages import DOCS, anchors, links, pages


def _broken(path) -> list[str]:
    text = path.read_text()
    broken = []
    for link in links(text):
        if "://" in link or link.startswith("mailto:"):
            continue
        target, _, fragment = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link} (no file {file})")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text()):
            broken.append(f"{link} (no heading #{fragment} in {file.relative_to(REPO)})")
    return broken


def test_every_relative_link_resolves():
    assert len(pages()) > 10
    assert {str(p.relative_to(REPO)): _broken(p) for p in pages() if _broken(p)} == {}


def test_the_readme_links_into_the_docs():
    targets = {link.partition("#")[0] for link in links((REPO / "README.md").read_text())}
    in_nav = {f"docs/{p.relative_to(DOCS)}" for p in DOCS.rglob("*.md")}
    assert in_nav <= targets | {"docs/index.md"}, sorted(in_nav - targets)


def test_the_figures_are_the_results_own():
    """The docs show copies of figures under results/ (docs/assets/results/...); each must equal its original."""
    copies = sorted((DOCS / "assets" / "results").rglob("*.png"))
    assert copies
    for copy in copies:
        assert copy.read_bytes() == (REPO / copy.relative_to(DOCS / "assets")).read_bytes(), copy


def test_every_results_path_the_pages_cite_exists():
    """A results/ path a page names in code (``results/tradeoff_bibtex/``) exists: removing or merging a results
    folder updates the pages that cite it (the history, which names removed folders, is in CHANGELOG.md)."""
    import re

    from tests.docs.pages import prose_lines

    missing = []
    for path in pages():
        for line in prose_lines(path.read_text()):
            for cited in re.findall(r"`(results/[^`\s]*)`", line):
                target = cited.rstrip("/.,;:")
                if not any(c in target for c in "<*{") and not (REPO / target).exists():
                    missing.append(f"{path.relative_to(REPO)}: {cited}")
    assert missing == []


def test_results_holds_at_most_100_files_and_no_archives():
    import subprocess

    files = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    assert 0 < len(files) <= 100, len(files)
    assert [f for f in files if f.endswith((".zip", ".tar", ".gz", ".tgz", ".bz2", ".xz", ".7z"))] == []


def test_every_list_starts_after_a_blank_line():
    """Python-Markdown (the site) reads a list glued to the paragraph above it as part of that paragraph: one run of
    text with literal dashes. Every list item that follows a paragraph line needs a blank line before it."""
    import re

    from tests.docs.pages import prose_lines

    item = re.compile(r"\s*(- |\* |\d+\. )")
    glued = []
    for path in pages():
        lines = prose_lines(path.read_text())
        for prev, line in zip(lines, lines[1:], strict=False):
            paragraph = prev.strip() and not item.match(prev) and not prev.startswith((" ", "#", "|", ">"))
            if item.match(line) and not line.startswith(" ") and paragraph:
                glued.append(f"{path.relative_to(REPO)}: {prev.strip()[:60]!r} then {line.strip()[:40]!r}")
    assert glued == []
