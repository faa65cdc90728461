"""``servescope``'s one command line: ``--help`` opens with what it answers, ``--version``, every command."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from loadtests.cli import main

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
