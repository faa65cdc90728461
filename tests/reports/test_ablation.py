"""The ablation table: each lever switched off in turn, against the full engine and the naive baseline."""

from __future__ import annotations

import pytest

from reports.ablation import STANDARD_VARIANTS, ablation_table, write_ablation_index
from reports.html.report import write_report
from reports.verdict.diagnosis import analyze


def test_the_table_has_every_variant_with_ratios(ablation_dir) -> None:
    table = analyze(ablation_dir).ablation  # the table with each variant's verdict
    assert table is not None and table.baseline == "continuous"
    rows = {r.name: r for r in table.rows}
    assert list(rows) == [v.name for v in STANDARD_VARIANTS]
    assert rows["continuous"].throughput_vs_baseline == pytest.approx(1.0)
    assert rows["naive"].throughput_vs_naive == pytest.approx(1.0)
    for row in table.rows:
        assert row.num_requests > 0 and row.ttft_p50 is not None and row.tpot_p99 is not None
    # batching is the lever this load leans on: without it (and in the raw framework) throughput drops
    assert rows["no-batching"].throughput_vs_baseline < 1 and rows["no-batching"].ttft_vs_baseline > 1
    assert rows["continuous"].throughput_vs_naive > 1
    assert rows["no-batching"].bottleneck == "batching" and rows["naive"].bottleneck == "batching"
    assert rows["contiguous"].bottleneck == "cache"  # 8 users, room for 4 max-length reservations


def test_the_report_of_an_ablation_directory(ablation_dir) -> None:
    result = write_report(ablation_dir)
    page = (ablation_dir / "report.html").read_text(encoding="utf-8")
    assert result["metrics"]["ablation"]["baseline"] == "continuous"
    assert len(result["metrics"]["ablation"]["rows"]) == len(STANDARD_VARIANTS)
    for variant in STANDARD_VARIANTS:
        assert f"<td>{variant.name}</td>" in page


def test_the_index_refuses_a_missing_baseline(tmp_path) -> None:
    with pytest.raises(ValueError, match="baseline"):
        write_ablation_index(tmp_path, STANDARD_VARIANTS[1:], baseline="continuous")
    assert ablation_table(tmp_path) is None


def test_diagnose_on_an_ablation_directory_judges_the_baseline(ablation_dir) -> None:
    from reports.verdict.diagnosis import diagnose

    result = diagnose(ablation_dir)
    assert result.label == "users-8" and result.source == "engine"
    assert [r["name"] for r in result.metrics["ablation"]["rows"]] == [v.name for v in STANDARD_VARIANTS]
