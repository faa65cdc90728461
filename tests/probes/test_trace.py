"""The Perfetto / Chrome trace: well-formed events, phases tiling their step, balanced async slices."""

from __future__ import annotations

import json
from collections import defaultdict

from probes.trace import PHASES_IN_RUN_ORDER, build_trace, export_trace
from tests.probes.conftest import CompleteRun


def _events(complete_run: CompleteRun) -> list[dict]:
    return json.loads((complete_run.path / "trace.json").read_text())["traceEvents"]


def test_every_event_has_the_fields_its_phase_needs(complete_run: CompleteRun) -> None:
    for event in _events(complete_run):
        assert event["ph"] in {"X", "b", "e", "C", "M"}
        assert isinstance(event["pid"], int)
        if event["ph"] != "M":
            assert isinstance(event["ts"], int | float) and event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0 and "tid" in event
        if event["ph"] in "be":
            assert isinstance(event["id"], int) and event["cat"] == "request"
        if event["ph"] == "C":
            assert event["args"] and all(isinstance(v, int | float) for v in event["args"].values())


def test_phase_slices_tile_their_step(complete_run: CompleteRun) -> None:
    events = [e for e in _events(complete_run) if e["ph"] == "X"]
    phase_names = {p.removesuffix("_s") for p in PHASES_IN_RUN_ORDER}
    steps = [e for e in events if e["name"] == "step"]
    phases = [e for e in events if e["name"] in phase_names]
    for step in steps:
        inside = [p for p in phases if step["ts"] <= p["ts"] < step["ts"] + step["dur"]]
        assert inside, "every step shows at least its forward pass"
        assert min(p["ts"] for p in inside) == step["ts"]
        assert abs(max(p["ts"] + p["dur"] for p in inside) - (step["ts"] + step["dur"])) < 1e-3
        assert sum(p["dur"] for p in inside) <= step["dur"] + 1e-3


def test_async_slices_nest_and_close_per_request(complete_run: CompleteRun) -> None:
    open_slices: dict[int, list[str]] = defaultdict(list)
    for event in _events(complete_run):
        if event["ph"] == "b":
            if not open_slices[event["id"]]:
                assert event["name"] == "request"
            open_slices[event["id"]].append(event["name"])
        elif event["ph"] == "e":
            assert open_slices[event["id"]].pop() == event["name"]
    assert open_slices and not any(open_slices.values())


def test_the_trace_can_be_rebuilt_from_the_directory(complete_run: CompleteRun) -> None:
    before = (complete_run.path / "trace.json").read_text()
    path = export_trace(complete_run.path)
    assert path.read_text() == before
    assert json.loads(before) == json.loads(json.dumps(build_trace(complete_run.run), allow_nan=False))
