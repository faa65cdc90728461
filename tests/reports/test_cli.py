"""The report command, in-process through reports.cli, and through the installed servescope when it has it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.cli import main


def test_report_writes_both_files(scenario_dir, tmp_path, capsys) -> None:
    path = tmp_path / "run"
    shutil.copytree(scenario_dir("host-overhead-10ms"), path)
    assert main(["report", str(path)]) == 0
    assert json.loads((path / "diagnosis.json").read_text())["bottleneck"] == "execution"
    assert (path / "report.html").stat().st_size > 0
    assert "bottleneck: execution" in capsys.readouterr().err.replace("\n", " ")


def test_report_on_a_non_run_fails_with_a_message(tmp_path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.slow
def test_the_installed_command_when_the_entry_point_is_there(scenario_dir, tmp_path) -> None:
    script = Path(sys.executable).parent / "servescope"
    if not script.exists():
        pytest.skip("servescope is not installed in this environment")
    listed = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    if "report" not in listed.stdout:
        pytest.skip("this install does not register the report command (entry point not added yet)")
    path = tmp_path / "run"
    shutil.copytree(scenario_dir("open-loop-trickle"), path)
    done = subprocess.run([str(script), "report", str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads((path / "diagnosis.json").read_text())["bottleneck"] == "none"
