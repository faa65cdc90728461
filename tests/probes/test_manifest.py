"""run.json: a schema object that round-trips, rejects what it cannot read, and names the code that ran."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from probes.manifest import ManifestError, RunManifest, git_state, servescope_version

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_round_trips_through_a_dict() -> None:
    manifest = RunManifest.collect(model="dummy:tiny", engine_config={"seed": 0}, seeds={"engine": 0},
                                   timers={"steps": "perf_counter"})
    assert RunManifest.from_dict(manifest.to_dict()) == manifest


def test_rejects_a_wrong_format_version_and_malformed_fields() -> None:
    data = RunManifest.collect().to_dict()
    with pytest.raises(ManifestError, match="format_version 99"):
        RunManifest.from_dict({**data, "format_version": 99})
    with pytest.raises(ManifestError, match="malformed field"):
        RunManifest.from_dict({**data, "status": "exploded"})
    with pytest.raises(ManifestError, match="JSON object"):
        RunManifest.from_dict([data])


def test_records_this_checkouts_version_and_commit() -> None:
    assert servescope_version() is not None
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip()
    if not head:
        pytest.skip("the checkout has no commit yet")
    commit, dirty = git_state(REPO_ROOT)
    assert commit == head and isinstance(dirty, bool)


def test_reports_no_commit_outside_a_checkout(tmp_path: Path) -> None:
    assert git_state(tmp_path) == (None, None)
