"""compare: a run against itself shows no change; two different runs show the right signs."""

from __future__ import annotations

import json

from loadtests.cli import main
from reports.compare import FIGURES, compare, regressions


def test_a_run_compared_with_itself_has_zero_deltas(scenario_dir) -> None:
    path = scenario_dir("max-num-seqs-2")
    comparison = compare([path, path], labels=["a", "b"])
    for fig in FIGURES:
        d = comparison.runs[1].deltas[fig.key]
        if comparison.runs[0].values[fig.key] is None:
            assert d.absolute is None
        else:
            assert d.absolute == 0 and d.is_better is None, fig.key
    assert regressions(comparison, 0.0) == []


def test_switching_batching_off_shows_the_right_signs(ablation_dir) -> None:
    comparison = compare([ablation_dir / "continuous", ablation_dir / "no-batching"])
    d = comparison.runs[1].deltas
    assert d["output_throughput"].absolute < 0 and d["output_throughput"].is_better is False
    assert d["request_throughput"].absolute < 0
    assert d["ttft_p50"].absolute > 0 and d["ttft_p50"].is_better is False
    assert d["mean_batch"].absolute < 0
    assert d["waiting_share"].absolute > 0
    assert comparison.runs[1].bottleneck == "batching"
    worse = regressions(comparison, 0.1)
    assert any("output tokens/s" in line for line in worse)
    # and the other way round, every sign flips
    back = compare([ablation_dir / "no-batching", ablation_dir / "continuous"]).runs[1].deltas
    assert back["output_throughput"].absolute > 0 and back["output_throughput"].is_better is True
    assert back["ttft_p50"].absolute < 0 and back["ttft_p50"].is_better is True


def test_the_compare_command_writes_html_and_json_and_gates(ablation_dir, tmp_path) -> None:
    base, off = str(ablation_dir / "continuous"), str(ablation_dir / "no-batching")
    out, js = tmp_path / "c.html", tmp_path / "c.json"
    assert main(["compare", base, base, "--labels", "before,after", "--out", str(out), "--json", str(js),
                 "--max-regression", "0"]) == 0
    assert out.is_file() and json.loads(js.read_text())["baseline"] == "before"
    assert main(["compare", base, off, "--out", str(out), "--max-regression", "0.1"]) == 1
    page = out.read_text()
    assert "no-batching" in page and 'class="worse"' in page
