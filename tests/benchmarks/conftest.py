"""The benchmark suite runs only under ``pytest --benchmark-only`` (or ``tox -e bench``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("benchmark_only", default=False):
        return
    skip = pytest.mark.skip(reason="a benchmark: run it with pytest --benchmark-only")
    for item in items:
        if "tests/benchmarks/" in item.nodeid:
            item.add_marker(skip)
