"""The `servescope generate` command, run as users run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def servescope_command() -> list[str]:
    script = Path(sys.executable).parent / "servescope"
    return [str(script)] if script.exists() else [sys.executable, "-m", "loadtests.cli"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*servescope_command(), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.real_model
def test_generate_on_default_model_continues_sensibly() -> None:
    result = run_cli("generate", "The capital of France is", "--max-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("The capital of France is")
    assert "Paris" in result.stdout


def test_generate_on_dummy_model_with_sampling() -> None:
    result = run_cli("generate", "hello", "--model", "dummy:tiny", "--max-tokens", "4", "--temperature", "0.8",
                     "--sampling-seed", "3")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("hello")


def test_bad_flags_give_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    # NOTE: the command's own main, in this process: the two tests above run the installed command itself, and
    # a process of its own would add only its start (seconds) to what is checked here.
    from loadtests.cli import main

    assert main(["generate", "hi", "--model", "dummy:tiny", "--block-size", "0"]) == 2
    assert "block_size must be a positive integer" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", "no-such-model"]) == 2
    assert "cannot load model 'no-such-model'" in capsys.readouterr().err
