"""``servescope diagnose --retest N``: diagnose, pull the lever predicted to gain most, run the same load again.

Each round is a full diagnose run in ``OUT/round-K/``. After round K its diagnosis names the best
lever (``diagnosis.json`` ``predictions.best``, predicted to gain at least 10% output throughput);
round K+1 runs the same load with that lever's flags added, and both rounds get ``retest.json``:
round K+1 what was pulled, predicted and measured (``pulled``), round K the same as the outcome of
its own prediction (``outcome``), which its ``diagnosis.json`` then carries as ``measured_gain``.
The rounds stop after N pulls, or as soon as no lever is predicted to gain 10%.
``OUT/retest.json`` lists the rounds; ``servescope compare OUT/round-0 OUT/round-1 ...`` reads them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from loadtests.config import LoadConfig
from probes.run_dir import DIAGNOSIS_NAME, RETEST_NAME, RunDirectory
from reports.whole_table import print_whole

if TYPE_CHECKING:
    from loadtests.run.orchestrator import SearchOptions

MEASURES = ("output_throughput", "ttft_p50", "tpot_p50")


def apply_flags(argv: list[str], add: list[str], drop: list[str]) -> list[str]:
    """``argv`` without the flags in ``drop`` (and the value after each), then ``add`` appended."""
    out: list[str] = []
    skip_value = False
    for token in argv:
        if skip_value:
            skip_value = False
            if not token.startswith("--"):
                continue
        if token in drop or token in add[::2]:
            skip_value = True
            continue
        out.append(token)
    return out + add


def best_lever(diagnosis: dict[str, Any]) -> dict[str, Any] | None:
    """The lever ``diagnosis.json`` predicts to gain most, if any is worth pulling."""
    best = (diagnosis.get("predictions") or {}).get("best")
    return next((lv for lv in diagnosis.get("levers") or [] if lv["lever"] == best), None)


def measured(diagnosis: dict[str, Any]) -> dict[str, Any]:
    return dict(((diagnosis.get("predictions") or {}).get("replay_check") or {}).get("measured") or {})


# How a round is run: (load, round directory, serve flags) -> the directory holds a diagnosed run.
RoundRunner = Callable[[LoadConfig, Path, list[str]], None]


def run_retest(config: LoadConfig, out: Path, serve_argv: list[str], model: str, console: Console,
               max_rounds: int, run_round: RoundRunner | None = None,
               search: SearchOptions | None = None) -> list[dict[str, Any]]:
    """Up to ``max_rounds`` pulls after the first diagnosis; returns one record per pull.

    ``run_round`` runs one round (default: ``diagnose``'s probed server under Locust). With ``search``, round 0
    is a capacity search (``config``'s users are the search's to choose) and the later rounds rerun the point its
    verdict was read at (its users, duration and warm-up) with the lever pulled.
    """
    if run_round is None:
        from loadtests.run.orchestrator import run_diagnose

        def run_round(load: LoadConfig, round_dir: Path, argv: list[str]) -> None:
            run_diagnose([load], round_dir, argv, model, console)

    first_round = run_round
    if search is not None:
        from loadtests.run.orchestrator import run_diagnose_search

        def first_round(load: LoadConfig, round_dir: Path, argv: list[str]) -> None:
            run_diagnose_search(load, round_dir, argv, model, console, search)

    if max_rounds < 1:
        raise ValueError(f"--retest takes a number of rounds >= 1, got {max_rounds}")
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; give --out a new directory")
    argv, load = list(serve_argv), config
    pulls: list[dict[str, Any]] = []
    previous: tuple[Path, dict[str, Any], dict[str, Any]] | None = None  # (dir, diagnosis, lever pulled)
    for index in range(max_rounds + 1):
        round_dir = out / f"round-{index}"
        console.rule(f"retest round {index}: {' '.join(argv) or 'the given flags'} ({load.point_name})")
        (first_round if index == 0 else run_round)(load, round_dir, argv)
        diagnosis = json.loads((round_dir / DIAGNOSIS_NAME).read_text())
        if index == 0 and search is not None:
            load = focus_load(round_dir, diagnosis, load)
        if previous is not None:
            record = pull_record(previous, round_dir, diagnosis)
            pulls.append(record)
            RunDirectory(previous[0]).write_json(RETEST_NAME, {"outcome": record})
            focus = previous[0] / str(previous[1].get("label") or "")
            if search is not None and focus != previous[0] and focus.is_dir():
                # NOTE: a search's verdict reads its predictions off the focus point's own directory
                RunDirectory(focus).write_json(RETEST_NAME, {"outcome": record})
            RunDirectory(round_dir).write_json(RETEST_NAME, {"pulled": record})
            diagnosis = rewrite_reports(previous[0], round_dir)
            print_pull(console, record)
        lever = best_lever(diagnosis)
        if lever is None:
            verdict = (diagnosis.get("predictions") or {}).get("verdict", "no prediction")
            console.print(f"retest stops after round {index}: {verdict}")
            break
        if index == max_rounds:
            console.print(f"retest stops after {max_rounds} pull(s); next lever: {lever['flags']} "
                          f"(predicted {lever['predicted_gain']:.2f}x)")
            break
        previous = (round_dir, diagnosis, lever)
        if lever.get("users"):
            load = dataclasses.replace(load, users=int(lever["users"]))
        else:
            argv = apply_flags(argv, list(lever.get("add_flags") or []), list(lever.get("drop_flags") or []))
    RunDirectory(out).write_json(RETEST_NAME, {"rounds": [f"round-{i}" for i in range(len(pulls) + 1)],
                                               "pulls": pulls})
    dirs = " ".join(str(out / f"round-{i}") for i in range(len(pulls) + 1))
    console.print(f"rounds side by side: servescope compare {dirs}")
    return pulls


def focus_load(search_dir: Path, diagnosis: dict[str, Any], base: LoadConfig) -> LoadConfig:
    """The load of the point a capacity search's verdict was read at (``diagnosis["label"]``, its point directory)."""
    info = RunDirectory(search_dir / str(diagnosis.get("label") or "")).load_info()
    if info is None or info.config.get("users") is None:
        raise ValueError(f"{search_dir}: the verdict's point {diagnosis.get('label')!r} has no load.json to rerun")
    point = info.config
    return dataclasses.replace(base, users=int(point["users"]), duration_s=float(point["duration_s"]),
                               warmup_s=float(point["warmup_s"]))


def pull_record(previous: tuple[Path, dict[str, Any], dict[str, Any]], round_dir: Path,
                diagnosis: dict[str, Any]) -> dict[str, Any]:
    """Before, predicted and measured for the lever pulled between two rounds, with the prediction errors."""
    before_dir, before_diagnosis, lever = previous
    before, after = measured(before_diagnosis), measured(diagnosis)
    predicted = {k: (lever.get("predicted") or {}).get(k) for k in MEASURES}
    errors = {k: (predicted[k] - after[k]) / after[k] if predicted.get(k) is not None and after.get(k) else None
              for k in MEASURES}
    gain = after["output_throughput"] / before["output_throughput"] \
        if after.get("output_throughput") and before.get("output_throughput") else None
    return {"lever": lever["lever"], "flags": lever["flags"], "description": lever["description"],
            "before_dir": str(before_dir), "after_dir": str(round_dir), "before": before, "predicted": predicted,
            "measured": after, "predicted_gain": lever.get("predicted_gain"), "measured_gain": gain,
            "errors": errors, "next": (diagnosis.get("predictions") or {}).get("verdict")}


def rewrite_reports(before_dir: Path, after_dir: Path) -> dict[str, Any]:
    """Rewrite both rounds' reports (they now hold ``retest.json``); returns the later round's diagnosis."""
    from reports import write_report

    write_report(before_dir)
    return write_report(after_dir)


def print_pull(console: Console, record: dict[str, Any]) -> None:
    table = Table(title=f"pulled {record['flags']}: before, predicted, measured")
    for column in ("measure", "before", "predicted", "measured", "prediction error"):
        table.add_column(column)
    for key in MEASURES:
        before, predicted, after = record["before"].get(key), record["predicted"].get(key), record["measured"].get(key)
        error = record["errors"].get(key)
        table.add_row(key, _fmt(before), _fmt(predicted), _fmt(after), f"{error:+.1%}" if error is not None else "–")
    print_whole(console, table)
    console.print(f"next: {record['next']}")


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4g}"
