"""The report in headless Chromium: no console errors, the verdict and every section visible, markup as text.

Needs Debian's ``chromium`` package (``/usr/bin/chromium``) and the ``playwright`` Python package
(its own browser downloads are not used).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reports.html.report import SECTIONS, write_report
from tests.reports.conftest import MARKUP_PROMPT

CHROMIUM = Path(os.environ.get("SERVESCOPE_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as p:
        instance = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield instance
        instance.close()


def open_page(browser, path: Path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.on("request", lambda r: problems.append(f"network: {r.url}") if not r.url.startswith("file:") else None)
    page.goto(path.as_uri(), wait_until="load")
    page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length > 0", timeout=30_000)
    return page, problems


def test_the_report_renders_without_errors(browser, markup_run) -> None:
    result = write_report(markup_run)
    page, problems = open_page(browser, markup_run / "report.html")
    try:
        verdict = page.locator("#bottleneck")
        assert verdict.is_visible() and result["bottleneck"].upper() in verdict.inner_text().upper()
        for section in SECTIONS:
            heading = page.locator(f"#{section.anchor} > h2")
            heading.scroll_into_view_if_needed()
            assert heading.is_visible() and heading.inner_text() == section.title
        num_plots = page.locator(".js-plotly-plot").count()
        assert num_plots >= 6 and page.locator(".js-plotly-plot .main-svg").count() >= num_plots
        cell = page.get_by_text(MARKUP_PROMPT, exact=True)
        cell.scroll_into_view_if_needed()
        assert cell.is_visible(), "the markup prompt is shown as text"
        assert page.locator("td b").count() == 0, "no markup from a prompt became an element"
        assert problems == []
    finally:
        page.close()


def test_an_external_servers_report_renders_without_errors(browser, external_dir) -> None:
    path = external_dir("metrics-pool")
    write_report(path)
    page, problems = open_page(browser, path / "report.html")
    try:
        assert "CACHE" in page.locator("#bottleneck").inner_text().upper()
        assert page.locator("#timelines .js-plotly-plot").count() >= 1
        assert problems == []
    finally:
        page.close()


def test_the_compare_page_renders_without_errors(browser, scenario_dir, tmp_path) -> None:
    from reports.compare import compare, render_compare

    out = tmp_path / "compare.html"
    out.write_text(render_compare(compare([scenario_dir("max-num-seqs-1"), scenario_dir("max-num-seqs-2")])))
    page, problems = open_page(browser, out)
    try:
        assert page.locator("#figures").is_visible() and page.locator("td.better").count() > 0
        assert problems == []
    finally:
        page.close()
