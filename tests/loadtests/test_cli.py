"""``servescope``'s one command line: ``--help`` opens with what it answers, ``--version``, every command."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from loadtests.cli import build_parser, main
from probes.run_dir import RUNS_DIR

COMMANDS = "{diagnose,load,report,compare,gate,serve,generate,bench,worker,fetch-model}"


def test_help_opens_with_the_question_the_tool_answers_and_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    usage, description = out.split("\n\n")[:2]
    assert COMMANDS in usage
    assert " ".join(description.split()).startswith(
        "servescope answers why an LLM inference server is not faster, and which lever fixes it")


def test_version_is_the_installed_distributions(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"servescope {version('servescope')}\n"


def test_what_servescope_makes_goes_under_runs_by_default() -> None:
    assert Path("runs") == RUNS_DIR
    assert Path(build_parser().parse_args(["compare", "a", "b"]).out) == RUNS_DIR / "compare.html"
    assert build_parser().parse_args(["diagnose"]).out is None  # then runs/diagnose-<time>/
