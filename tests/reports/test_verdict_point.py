"""Where a capacity search's verdict is read when the point its rules name leaves the limit undecided, or was
run slower by the host.

The fixture is a recorded run of README's main job (``servescope diagnose``, run 3 of the fourth hold in
docs/results.md, "Repeatability of the main job": 2026-12-06 20:56 UTC, the shared 2-core AMD EPYC, int at
ec963fe), replayed from its probe tables and client rows (its request log and Locust's own files left out). Its
points' own verdicts were ``none`` up to 8 users, ``execution`` at 12 and 16, ``batching`` at 24, whose engine ran
1.67x its calibration (1.30x the search's median point), and ``none`` at 32, where requests queued and no
bottleneck's evidence was complete (undecided). Read with the saturation rule, its capacity is 16 users, so the
capacity's rules read the verdict at 24.
"""

from __future__ import annotations

from html import unescape
from pathlib import Path

from reports.verdict.diagnosis import analyze

FIXTURE = Path(__file__).parent / "fixtures" / "capacity" / "main-job-host-slowed"


def test_a_host_slowed_point_past_the_capacity_hands_the_verdict_to_the_heaviest_lighter_point_that_decides() -> None:
    analysis = analyze(FIXTURE)
    verdicts = {p.label: v.bottleneck for p, v in zip(analysis.points, analysis.point_verdicts, strict=True)}
    assert analysis.capacity is not None and analysis.capacity.concurrency == 16
    assert analysis.capacity.past_knee_users == 24
    assert verdicts["users-24"] == "batching"  # decided, but on a point the host slowed
    slowdown = {p.users: p.engine_slowdown for p in analysis.capacity.points}
    assert slowdown[24] >= 1.15 and slowdown[16] < 1.15
    assert analysis.focus.label == "users-16" and analysis.diagnosis.bottleneck == "execution"
    moved = analysis.diagnosis.metrics["verdict_point"]
    assert moved["instead_of"] == "users-24" and moved["label"] == "users-16"
    assert "the host ran the engine slower (1.30x" in moved["why"] and "read at users-16" in analysis.diagnosis.summary


def test_an_undecided_point_hands_the_verdict_on_passing_over_host_slowed_points(monkeypatch) -> None:
    import reports.verdict.diagnosis as diagnosis

    # The capacity's rules reading the heaviest point, as they do when no capacity is named.
    monkeypatch.setattr(diagnosis, "capacity_focus", lambda capacity, measures: len(measures) - 1)
    analysis = analyze(FIXTURE)
    assert "undecided" in analysis.point_verdicts[-1].summary and analysis.point_verdicts[-1].bottleneck == "none"
    assert analysis.focus.label == "users-16" and analysis.diagnosis.bottleneck == "execution"
    moved = analysis.diagnosis.metrics["verdict_point"]
    assert moved["instead_of"] == "users-32" and moved["label"] == "users-16"
    assert "which limit binds was undecided" in moved["why"] and "users-24 passed over" in moved["why"]


def test_the_report_says_where_the_verdict_was_read_and_why(tmp_path) -> None:
    from reports.html.report import write_report

    diagnosis = write_report(FIXTURE, tmp_path)
    assert diagnosis["label"] == "users-16" and diagnosis["metrics"]["verdict_point"]["instead_of"] == "users-24"
    html = unescape((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert "Verdict read at users-16: at users-24, where the capacity's rules read the verdict" in html
    slowed = html[html.index("The host ran the engine slower under some points"):].split("</")[0]
    assert "at 24 users its decode steps took 1.67x" in slowed and "at 12 users" in slowed  # 1.17x the median
    assert "at 16 users" not in slowed
