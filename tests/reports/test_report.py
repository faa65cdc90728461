"""The HTML report: self-contained, every section present, request text escaped."""

from __future__ import annotations

import re

import markupsafe
import pytest

from reports.html.report import SECTIONS, section, write_report
from tests.reports.conftest import MARKUP_PROMPT


def test_the_report_is_one_offline_file_with_every_section(markup_run) -> None:
    result = write_report(markup_run)
    page = (markup_run / "report.html").read_text(encoding="utf-8")
    assert result["bottleneck"] == "batching"
    assert not re.search(r"<script[^>]+src=", page), "the report must not load scripts from elsewhere"
    assert not re.search(r"<link[^>]+href=", page), "nor stylesheets"
    assert page.count("Plotly.newPlot") >= 6  # timelines, waits, CDFs, goodput, steps, roofline
    assert page.count("* plotly.js v") == 1, "plotly.js is inlined exactly once"
    assert page.index("* plotly.js v") < page.index("</head>")
    for s in SECTIONS:
        assert f'<section id="{s.anchor}">' in page and f"<h2>{s.title}</h2>" in page
    assert page.index('id="verdict"') < page.index('id="timelines"')


def test_the_sections_are_listed_once_in_page_order_and_an_unknown_one_fails_loudly() -> None:
    assert [s.anchor for s in SECTIONS][:3] == ["capacity", "verdict", "levers"]
    assert section("verdict").title == "Verdict"
    with pytest.raises(ValueError, match="no report section 'verdicts'; the sections: capacity, verdict, levers"):
        section("verdicts")


def test_request_text_is_escaped(markup_run) -> None:
    write_report(markup_run)
    page = (markup_run / "report.html").read_text(encoding="utf-8")
    assert MARKUP_PROMPT not in page
    assert str(markupsafe.escape(MARKUP_PROMPT)) in page
    assert "<script>alert(1)" not in page


def test_a_sweep_directory_reports_every_point(external_dir) -> None:
    path = external_dir("sweep-cap")
    result = write_report(path)
    page = (path / "report.html").read_text(encoding="utf-8")
    assert result["bottleneck"] == "batching" and len(result["metrics"]["points"]) == 3
    for label in ("users-1", "users-4", "users-8"):
        assert label in page
    assert "No engine steps" in page  # the step sections say why they are empty


def test_report_into_another_directory(scenario_dir, tmp_path) -> None:
    path = scenario_dir("open-loop-trickle")
    result = write_report(path, tmp_path / "out")
    assert (tmp_path / "out" / "report.html").is_file() and result["bottleneck"] == "none"


def _section(page: str, anchor: str) -> str:
    start = page.index(f'<section id="{anchor}">')
    return page[start:page.index("</section>", start)]


def test_successful_requests_show_no_error_and_shares_read_as_percentages(markup_run) -> None:
    write_report(markup_run)
    page = (markup_run / "report.html").read_text(encoding="utf-8")
    requests = _section(page, "requests")
    assert ">nan<" not in requests and ">None<" not in requests
    steps = _section(page, "steps")
    shares = re.findall(r"<tr><td>(schedule|prepare|forward|sample|output|host_overhead)</td><td>([^<]*)</td>", steps)
    assert len(shares) == 6 and all(share.endswith("%") for _, share in shares)


def test_a_roofline_above_the_roof_is_refused_with_a_note(scenario_dir, tmp_path) -> None:
    """Peaks measured far too low (as under load) put steps above the roof: the figure is not drawn."""
    import shutil

    from probes.run_dir import RunDirectory

    run = tmp_path / "run"
    shutil.copytree(scenario_dir("two-users-large-pool"), run)
    directory = RunDirectory(run)
    peaks = directory.read_peaks()
    assert peaks is not None
    peaks.bandwidth_bytes_per_s /= 1e4
    peaks.flops_per_s /= 1e4
    directory.write_peaks(peaks)
    write_report(run)
    roofline = _section((run / "report.html").read_text(encoding="utf-8"), "roofline")
    assert "Not plotted" in roofline and "above the roof" in roofline and "Plotly.newPlot" not in roofline
