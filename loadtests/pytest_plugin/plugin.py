"""servescope's pytest plugin: load an LLM server from a test, assert on what it measured, benchmark it.

Loaded by pytest through the ``pytest11`` entry point wherever servescope is installed. It adds
options (``--llm-target URL``, ``--llm-model``, ``--llm-engine-args``, ...), the fixtures ``llm_server``
(session), ``llm_load`` and ``llm_benchmark``, and the marker ``llm_slo``; see docs/pytest.md.

NOTE: every pytest run where servescope is installed imports this module, servescope's own suite
included: it imports only pytest and the standard library at the top (torch, pandas and the
orchestrator load inside the fixtures), and its hooks act only on tests that use its fixtures or marker.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loadtests.pytest_plugin.benchmark import (
    DEFAULT_ROUND_METRICS,
    check_metrics,
    check_rates,
    check_unused,
    parse_rate_check,
    record_rounds,
)
from loadtests.pytest_plugin.load_point import LoadPointError, load_config, run_load_point
from loadtests.pytest_plugin.results import LoadRun
from loadtests.pytest_plugin.server import LLMServer, ServerStartError, bundled_server, external_server
from loadtests.pytest_plugin.slo import SLOViolation, check_slo

DEFAULT_STARTUP_TIMEOUT_S = 600.0
SECTION_TITLE = "servescope load points"
RUNS_KEY = pytest.StashKey[list[LoadRun]]()
SERVER_KEY = pytest.StashKey[LLMServer]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("servescope", "servescope: load, assert on and benchmark an LLM server")
    group.addoption("--llm-target", metavar="URL", default=None,
                    help="load this OpenAI-compatible server instead of starting servescope serve (its API key "
                         "from $SERVESCOPE_API_KEY)")
    group.addoption("--llm-model", default=None,
                    help="the bundled server's --model (default: servescope serve's own, smollm2-135m); "
                         "e.g. dummy:tiny")
    group.addoption("--llm-engine-args", metavar="FLAGS", default="",
                    help="more flags for the bundled servescope serve, as one string: \"--max-num-seqs 8\"")
    group.addoption("--llm-served-model", metavar="NAME", default=None,
                    help="with --llm-target: the model name to request (default: the first /v1/models lists)")
    group.addoption("--llm-tokenizer", default=None,
                    help="tokenizer to cut prompts with, as servescope load --tokenizer (default: the served "
                         "model's when servescope knows it, else smollm2-135m)")
    group.addoption("--llm-startup-timeout", type=float, default=DEFAULT_STARTUP_TIMEOUT_S, metavar="S",
                    help="seconds the bundled server may take to answer /health (default %(default)g)")
    group.addoption("--llm-compare-fail", metavar="FIELD:X%", action="append", type=parse_rate_check, default=[],
                    help="with --benchmark-compare: fail an llm_benchmark test whose FIELD (output_tokens_per_s, "
                         "requests_per_s or goodput_fraction) fell more than X%% below the compared run's")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "llm_slo(**bounds): fail the test when any load point it ran misses a "
                                       "bound (ttft_p99=0.5, max_failed=0, ...; see check_slo)")
    if config.getoption("llm_compare_fail") and not config.getoption("benchmark_compare", default=None):
        raise pytest.UsageError("--llm-compare-fail compares against a saved run: add --benchmark-compare")


# -- the server ----------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def llm_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LLMServer]:
    """The server under test for the whole session: ``--llm-target``, else ``servescope serve`` started here.

    Parametrize it indirectly with engine flags (``@pytest.mark.parametrize("llm_server", ["--max-num-seqs
    4"], indirect=True)``) for a bundled server with those flags; against ``--llm-target`` such a test is
    skipped.
    """
    config = request.config
    flags = _flags(getattr(request, "param", None))
    target = config.getoption("llm_target")
    if target is not None:
        if flags:
            pytest.skip(f"engine flags {shlex.join(flags)} are for the bundled server; --llm-target {target} "
                        f"is another one")
        try:
            server = external_server(target, config.getoption("llm_served_model"), config.getoption("llm_tokenizer"))
        except ServerStartError as exc:
            raise _failure(exc) from None
        yield server
        return
    model = config.getoption("llm_model")
    argv = [*(["--model", model] if model else []), *shlex.split(config.getoption("llm_engine_args")), *flags]
    try:
        with bundled_server(tmp_path_factory.mktemp("llm-server"), argv, config.getoption("llm_startup_timeout"),
                            config.getoption("llm_tokenizer")) as server:
            yield server
    except ServerStartError as exc:
        raise _failure(exc) from None


def _failure(exc: Exception) -> BaseException:
    """The test fails with ``exc``'s message alone. NOTE: raised ``from None``, or pytest prints the message
    twice, once for ``exc`` and once for the failure raised while handling it."""
    return pytest.fail.Exception(str(exc), pytrace=False)


def _flags(param: Any) -> list[str]:
    if param is None:
        return []
    if isinstance(param, str):
        return shlex.split(param)
    return [str(p) for p in param]


# -- one load point --------------------------------------------------------------------------------
class LoadPoint:
    """``llm_load``: call it to run one load point against ``llm_server``; it returns the :class:`LoadRun`.

    Keywords: ``users`` or ``rate``, ``duration``, ``warmup`` (seconds), ``workload``, ``max_tokens``,
    ``seed``, ``slo`` (``{"ttft": 0.5}`` or ``"ttft=0.5"``: goodput's bounds), ``api``, any other
    ``LoadConfig`` field (``processes``, ``ignore_eos``, ...), and ``reference=True`` to also time the
    target's decode step against ``servescope serve`` as ``servescope load`` does.
    """

    def __init__(self, server: LLMServer, out: Path, item: pytest.Item) -> None:
        self.server = server
        self.out = out
        self._item = item
        self._counter = itertools.count(1)

    def __call__(self, *, reference: bool = False, **keywords: Any) -> LoadRun:
        config = load_config(**keywords)
        run_dir = self.out / f"load-{next(self._counter)}-{config.point_name}"
        try:
            run = run_load_point(self.server, run_dir, config, reference=reference)
        except LoadPointError as exc:
            raise _failure(exc) from None
        self._item.stash.setdefault(RUNS_KEY, []).append(run)
        return run


@pytest.fixture
def llm_load(llm_server: LLMServer, tmp_path: Path, request: pytest.FixtureRequest) -> LoadPoint:
    """Run load points against ``llm_server``: ``run = llm_load(users=8, duration=30)``; each point's run
    directory is under the test's ``tmp_path`` and is printed when the test fails."""
    request.node.stash[SERVER_KEY] = llm_server
    return LoadPoint(llm_server, tmp_path, request.node)


# -- pytest-benchmark ------------------------------------------------------------------------------
class BenchmarkPoint:
    """``llm_benchmark``: one load point recorded into pytest-benchmark (see :mod:`.benchmark`).

    Takes ``llm_load``'s keywords, plus ``metrics``: which per-request times become benchmark rounds
    (default ttft and e2e; tpot too if asked). Once per test, like pytest-benchmark's own fixture.
    """

    def __init__(self, benchmark: Any, load: LoadPoint, config: pytest.Config) -> None:
        self._benchmark = benchmark
        self._load = load
        self._config = config

    def __call__(self, *, metrics: tuple[str, ...] = DEFAULT_ROUND_METRICS, **keywords: Any) -> LoadRun:
        try:
            check_metrics(tuple(metrics))
            check_unused(self._benchmark)
            run = self._load(**keywords)
            entries = record_rounds(self._benchmark, run, tuple(metrics), self._load.server.url)
        except ValueError as exc:
            raise _failure(exc) from None
        checks = self._config.getoption("llm_compare_fail")
        regression = check_rates(self._config, checks, self._benchmark.fullname, entries[0]) if entries else None
        if regression is not None:
            pytest.fail(f"throughput regressed: {regression}", pytrace=False)
        return run


@pytest.fixture
def llm_benchmark(benchmark: Any, llm_load: LoadPoint, request: pytest.FixtureRequest) -> BenchmarkPoint:
    """One load point as pytest-benchmark rounds: ``run = llm_benchmark(users=4, duration=20)``; works with
    ``--benchmark-only``, ``--benchmark-autosave``, ``--benchmark-compare`` and ``--benchmark-compare-fail``."""
    return BenchmarkPoint(benchmark, llm_load, request.config)


# -- reporting and the SLO marker -----------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    marker = item.get_closest_marker("llm_slo")
    if marker is None:
        return result
    if marker.args:
        raise pytest.UsageError(f"{item.nodeid}: llm_slo takes keywords only (ttft_p99=0.5), got {marker.args}")
    runs = item.stash.get(RUNS_KEY, [])
    if not runs:
        pytest.fail("@pytest.mark.llm_slo: this test ran no load point (llm_load or llm_benchmark)", pytrace=False)
    messages = []
    for run in runs:
        try:
            check_slo(run, **marker.kwargs)
        except SLOViolation as exc:
            messages.append(str(exc))
    if messages:
        pytest.fail("\n".join(messages), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    runs = item.stash.get(RUNS_KEY, [])
    server = item.stash.get(SERVER_KEY, None)
    if report.when == "call" and (runs or server is not None):
        # NOTE: pytest prints a report's sections under a failed test (and with -rP under a passed one).
        lines = [server.describe()] if server is not None else []
        lines += [run.describe() for run in runs]
        report.sections.append((SECTION_TITLE, "\n".join(lines)))
    return report
