"""The pytest plugin as a user's suite meets it: inner pytest sessions (pytester, each in its own process, as
``pytest`` in a user's directory) with only a test file and servescope installed.

Each inner session that starts a server runs ``servescope serve --model dummy:tiny``; the load points are
one second long. After every inner session, no process it started may be left.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

# A hang in an inner session fails its test instead of stalling the suite.
INNER_TIMEOUT_S = 300
BUNDLED = ("--llm-model", "dummy:tiny")
# What pytest loading the plugin must not import (every pytest run with servescope installed loads it).
HEAVY_MODULES = ("torch", "numpy", "pandas", "pyarrow", "locust", "gevent", "rich", "reports", "probes")


def processes_mentioning(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` (an inner session's server or Locust would)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if str(path) in line:
            found.append(line)
    return found


def test_loading_the_plugin_imports_nothing_heavy() -> None:
    code = ("import sys, loadtests.pytest_plugin.plugin; "
            f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_the_plugin_is_active_and_leaves_other_suites_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_fails():\n    assert 1 == 2\n\n\ndef test_passes():\n    pass\n")
    result = pytester.runpytest_subprocess("-rA", timeout=INNER_TIMEOUT_S)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.no_fnmatch_line("*servescope load points*")
    result.stdout.fnmatch_lines(["plugins: *servescope-*"])
    shown = pytester.runpytest_subprocess("--help", timeout=INNER_TIMEOUT_S)
    shown.stdout.fnmatch_lines(["*--llm-target=URL*", "*--llm-model=*", "*--llm-engine-args=FLAGS*",
                                "*--llm-compare-fail=FIELD:X%*"])


# NOTE: slow: the failing server imports servescope's whole CLI (torch, transformers) first, 10-20 s;
# test_a_server_not_healthy_in_time_is_stopped covers the stop path in the default run.
@pytest.mark.slow
def test_a_server_that_cannot_start_is_a_clear_error_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="""
        def test_load(llm_load):
            llm_load(users=1, duration=1)

        def test_server(llm_server):
            pass
    """)
    result = pytester.runpytest_subprocess("--llm-model", "no-such-model", timeout=INNER_TIMEOUT_S)
    result.assert_outcomes(errors=2)
    result.stdout.no_fnmatch_line("*During handling of the above exception*")
    result.stdout.fnmatch_lines([
        "*servescope serve --model no-such-model could not start: the server exited with status 2 before it was "
        "healthy; its log (*server.log) ends:",
        "*servescope: error: cannot load model 'no-such-model'*",
    ])
    # NOTE: a session fixture's failure is kept for the session: one start, both tests told.
    basetemp = next(pytester.path.glob("runpytest-*"))
    assert len(list(basetemp.glob("llm-server[0-9]*"))) == 1
    assert processes_mentioning(pytester.path) == []


def test_a_server_not_healthy_in_time_is_stopped(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_server(llm_server):\n    pass\n")
    # NOTE: 10 ms: no server imports torch and builds a model that fast, so this always times out.
    result = pytester.runpytest_subprocess(*BUNDLED, "--llm-startup-timeout", "0.01", timeout=INNER_TIMEOUT_S)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*servescope serve --model dummy:tiny could not start: the server was not healthy "
                                 "after 0 s*"])
    assert processes_mentioning(pytester.path) == []


def test_an_unreachable_target_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_server(llm_server):\n    pass\n")
    # NOTE: port 1 on loopback: nothing listens there, so the connection is refused at once.
    result = pytester.runpytest_subprocess("--llm-target", "http://127.0.0.1:1", timeout=INNER_TIMEOUT_S)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--llm-target http://127.0.0.1:1: http://127.0.0.1:1 does not answer GET "
                                 "/v1/models as an OpenAI-compatible server*"])


SLO_TESTS = """
    import json

    import numpy as np
    import pytest

    from loadtests.pytest_plugin import check_slo

    RUNS = []


    @pytest.mark.llm_slo(e2e_p99=1e-6, max_failed=0)
    def test_marker(llm_load):
        RUNS.append(llm_load(users=1, duration=1, warmup=0, max_tokens=4, slo={"ttft": 1000}))


    def test_check_slo():
        check_slo(RUNS[0], ttft_p50=1e-6, min_goodput=0.5)


    def test_plain_assert():
        assert RUNS[0].ttft.p90 < 1e-6


    def test_the_run_is_what_summary_json_says():
        run = RUNS[0]
        client = json.loads((run.run_dir / "summary.json").read_text())["points"][0]["client"]
        assert run.num_ok == client["num_ok"] > 0
        for name in ("ttft", "tpot", "itl", "e2e"):
            latency, stats = getattr(run, name), client[f"{name}_s"]
            if stats is None:  # a one-second point on a busy machine can measure no ITL gap at all
                assert latency.count == 0 and np.isnan(latency.p50)
                continue
            assert latency.count == stats["count"]
            for p in (50, 90, 99):
                assert getattr(latency, f"p{p}") == stats[f"p{p}"] == np.percentile(latency.values, p)
        assert run.output_tokens_per_s == client["output_throughput"]
        assert run.goodput.fraction == 1.0
        verdict = json.loads((run.run_dir / "diagnosis.json").read_text())
        assert run.verdict.bottleneck == verdict["bottleneck"]
        assert [e.name for e in run.verdict.evidence] == [e["name"] for e in verdict["evidence"]]
        assert run.report_path.is_file()
"""


# NOTE: slow: a server start and a load point, 35-50 s; test_slo.py checks the same messages in the default run.
@pytest.mark.slow
def test_slo_failures_print_the_measured_distribution(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=SLO_TESTS)
    result = pytester.runpytest_subprocess(*BUNDLED, timeout=INNER_TIMEOUT_S)
    result.assert_outcomes(failed=3, passed=1)
    result.stdout.fnmatch_lines([
        # the marker: every bound, failed or not, with the distribution it was read from
        "*_ test_marker _*",
        "SLO not met at users-1: 1 of 2 bound(s) failed",
        "  FAILED e2e p99 = * > 1 us; E2E p50 *, p90 *, p99 *, max * (* requests)",
        "  ok     max_failed = 0 <= 0; 0 of * measured requests failed",
        "  run directory: *load-1-users-1",
        "  report: *load-1-users-1/report.html",
        # the report section pytest prints under a failed test
        "*- servescope load points -*",
        "server under test: servescope serve --model dummy:tiny at http://127.0.0.1:*; log *server.log",
        "users-1: * ok, 0 failed, * output tok/s, * req/s",
        "  TTFT p50 *, p90 *, p99 *, max * (* requests)",
        "  verdict: *",
        # check_slo
        "*_ test_check_slo _*",
        "E * SLO not met at users-1: 1 of 2 bound(s) failed",
        "E *FAILED ttft p50 = * > 1 us; TTFT p50 *",
        "E *ok     min_goodput = 1 >= 0.5; * of * requests within {'ttft': 1000*}",
        # a plain assert: pytest's own message shows the distribution
        "*_ test_plain_assert _*",
        "E *where * = <TTFT p50 *, p90 *, p99 *, max * (* requests)>.p90",
    ])
    run_dir = Path(re.search(r"run directory: (\S+)", result.stdout.str()).group(1))
    assert run_dir.is_relative_to(pytester.path)  # under the inner session's tmp_path, kept after it
    assert (run_dir / "report.html").is_file()
    assert json.loads((run_dir / "load.json").read_text())["config"]["users"] == 1
    assert processes_mentioning(pytester.path) == []


BENCH_TEST = """
    def test_point(llm_benchmark):
        run = llm_benchmark(users=1, duration=3, warmup=0, max_tokens=4)
        assert run.num_ok > 0
"""


@pytest.mark.slow
def test_benchmark_autosave_compare_and_fail(pytester: pytest.Pytester) -> None:
    """pytest-benchmark's own save, compare and compare-fail on the per-request rounds, and
    ``--llm-compare-fail`` on tokens per second: a pass on the same server, a fail on a slowed one."""
    pytester.makepyfile(test_bench=BENCH_TEST)
    storage = pytester.path / "stored"
    common = (*BUNDLED, "--benchmark-only", "--benchmark-storage", str(storage))
    saved = pytester.runpytest_subprocess(*common, "--benchmark-autosave", timeout=INNER_TIMEOUT_S)
    saved.assert_outcomes(passed=1)
    (stored,) = storage.rglob("*.json")
    benchmarks = {b["fullname"]: b for b in json.loads(stored.read_text())["benchmarks"]}
    assert set(benchmarks) == {"test_bench.py::test_point[ttft]", "test_bench.py::test_point[e2e]"}
    for fullname, bench in benchmarks.items():
        info = bench["extra_info"]
        assert info["output_tokens_per_s"] > 0
        assert bench["stats"]["median"] == pytest.approx(info[f"{info['metric']}_p50_s"]), fullname
    # One round per measured request; NOTE: a dummy model's stream can carry no text until its last chunk,
    # so some requests have an E2E but no TTFT.
    e2e, ttft = (benchmarks[f"test_bench.py::test_point[{m}]"] for m in ("e2e", "ttft"))
    assert e2e["stats"]["rounds"] == e2e["extra_info"]["num_ok"] > 0
    assert 0 < ttft["stats"]["rounds"] <= ttft["extra_info"]["num_ok"]

    # NOTE: thresholds that a shared machine's noise cannot cross (a median 1.5 s later, a tenth of the tokens
    # per second) and a slowdown that crosses both: 1.5 s of host work per engine step makes a 4-token
    # request take 6 s or more (under 1 tok/s), against well under a second on the plain server.
    checks = ("--benchmark-compare", "--benchmark-compare-fail=median:1.5", "--llm-compare-fail",
              "output_tokens_per_s:90%")
    same = pytester.runpytest_subprocess(*common, *checks, timeout=INNER_TIMEOUT_S)
    same.assert_outcomes(passed=1)
    assert same.ret == 0
    # NOTE: one at a time: pytest-benchmark sorts the table's rows by their minimum, so either comes first.
    for row in ("test_point?e2e? (0001_*", "test_point?e2e? (NOW)*"):
        same.stdout.fnmatch_lines([row])

    slowed = pytester.runpytest_subprocess(*common, *checks, "--llm-engine-args", "--host-overhead-ms 1500",
                                           timeout=INNER_TIMEOUT_S)
    # NOTE: pytest-benchmark raises its regression from the terminal summary, before pytest's outcome line.
    assert slowed.ret != 0
    slowed.stdout.fnmatch_lines(["test_bench.py F*"])
    slowed.stdout.fnmatch_lines([
        "throughput regressed: test_bench.py::test_point against *0001_*.json:",
        "  output tok/s fell *% (* -> *), more than --llm-compare-fail output_tokens_per_s:90% allows",
    ])
    # NOTE: pytest-benchmark logs its regressions to stderr.
    pytest.LineMatcher(slowed.errlines).fnmatch_lines([
        "*Performance has regressed:",
        "*test_point?e2e? (0001_*) - Field 'median' has failed DifferenceRegressionCheck*"])
    assert processes_mentioning(pytester.path) == []
