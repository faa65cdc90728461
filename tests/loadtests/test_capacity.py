"""The capacity search against real servers and real Locust: it finds a known seat limit, and its tokens
experiment tells a seat-limited server from a memory-limited one."""

from __future__ import annotations

import argparse
import json

import pytest

from loadtests.capacity import _Measured, doubling_plateau, point_past_the_top, refine_around, refine_points
from loadtests.cli import main
from loadtests.config import StopRule
from loadtests.run.server_process import ServerProcess
from reports.capacity.interval import RateInterval
from tests.loadtests.test_diagnose import check_nothing_lost

# Each engine step burns this much host time, so a step costs about the same at any batch size (as a
# GPU's decode step does) and throughput grows with the batch until the seats run out.
STEP_MS = "50"


def search_load(duration_s: int = 4) -> list[str]:
    """A short search's load flags: points of at most ``duration_s``."""
    return ["--workload", "fixed", "--max-tokens", "16", "--duration", str(duration_s), "--warmup", "1",
            "--stop-timeout", "15", "--max-users", "16"]


def test_no_users_rate_or_sweep_means_a_search() -> None:
    from loadtests.cli import build_parser
    from loadtests.load_flags import DIAGNOSE_DEFAULTS, configs_from_args, diagnose_max_users, is_search

    parser = build_parser()

    def parse(*argv: str) -> argparse.Namespace:
        return parser.parse_args(["diagnose", *argv])

    assert is_search(parse())
    configs, sweep = configs_from_args(parse(), DIAGNOSE_DEFAULTS)
    assert sweep is None and configs[0].users == 1
    assert configs[0].duration_s == DIAGNOSE_DEFAULTS["search_duration"]
    # Past twice the engine's seats extra users only queue: diagnose searches no further unless told.
    assert diagnose_max_users(parse()) == 32 and diagnose_max_users(parse("--max-num-seqs", "4")) == 8
    assert diagnose_max_users(parse("--max-num-seqs", "4", "--max-users", "12")) == 12
    for explicit in (["--users", "8"], ["--rate", "2"], ["--sweep", "users=1,2"], ["--ablate"],
                     ["--workload", "trace:sample-mooncake"], ["--retest", "--users", "8"]):
        assert not is_search(parse(*explicit)), explicit
    # A search's points end by their interval (--warmup and --duration are caps); a single point keeps its
    # fixed schedule unless asked; --interval 0 turns the rule off.
    assert configs[0].stop_rule == StopRule(DIAGNOSE_DEFAULTS["search_interval"] / 100)
    assert configs_from_args(parse("--interval", "0"), DIAGNOSE_DEFAULTS)[0][0].stop_rule is None
    assert configs_from_args(parse("--users", "8"), DIAGNOSE_DEFAULTS)[0][0].stop_rule is None
    assert configs_from_args(parse("--users", "8", "--interval", "10"), DIAGNOSE_DEFAULTS)[0][0].stop_rule == \
        StopRule(0.1)
    # --retest alone searches first, then reruns the verdict's point with the lever pulled
    assert is_search(parse("--retest"))


def test_one_doubling_that_gains_little_does_not_end_the_search() -> None:
    # The main job's points on smollm2-135m: 4 users gained 1.14x over 2, then 8 users 1.9x over 4.
    assert doubling_plateau([(1, 16.0), (2, 28.6), (4, 32.6)]) == (2, None)
    assert doubling_plateau([(1, 16.0), (2, 28.6), (4, 32.6), (8, 61.5)]) == (8, None)
    # Two doublings in a row without a 1.15x rise over the best point before them (16 users) end it there.
    last_rise, why = doubling_plateau([(1, 16.3), (2, 28.9), (4, 35.5), (8, 61.5), (16, 79.1), (32, 80.5),
                                       (64, 80.0)])
    assert last_rise == 16 and why is not None and "80.0 at 64 over 80.5" in why and "2 doublings" in why
    # Nor does one that falls: the main job's 4-user point read 26.9 tok/s after 27.5 at 2 users, then 8 users rose.
    assert doubling_plateau([(1, 15.9), (2, 27.5), (4, 26.9)]) == (2, None)
    # Past a seat limit of 4 (dummy:tiny, 50 ms a step): 8 and 16 users crept 1.14x and 1.17x over 4 users,
    # under the 1.15x per doubling (1.32x over two) a rise needs.
    assert doubling_plateau([(1, 16.0), (2, 32.7), (4, 64.0), (8, 72.8), (16, 75.1)])[0] == 4
    # Creeping 1.10x and 1.03x is no rise: 30 -> 33 -> 34 stops with the last rise at 2 users.
    assert doubling_plateau([(1, 10.0), (2, 30.0), (4, 33.0), (8, 34.0)])[0] == 2
    assert doubling_plateau([(1, 10.0), (2, 30.0), (4, 33.0), (8, 34.0)])[1] is not None
    assert doubling_plateau([(1, 10.0)]) == (1, None)


def test_a_rise_is_measured_against_the_best_point_before_it_not_the_last_rise() -> None:
    # The fifteenth hold's first run (AVX2 box, 2026-12-07): 4 users read 59.3 tok/s, 8 users 66.4 (1.12x) and
    # 16 users 77.0 (1.16x over 8, 1.30x over 4). Against the last rise (1.15x, then 1.32x over 4) the doubling
    # stopped at 16 with nothing past it; 16 rose over the best point before it, so the search goes on.
    assert doubling_plateau([(1, 22.0), (2, 38.4), (4, 59.3), (8, 66.4), (16, 77.0)]) == (16, None)
    # A point that falls leaves the best where it was: 8 and 16 are measured against 4's 60.0.
    assert doubling_plateau([(1, 22.0), (2, 38.0), (4, 60.0), (8, 50.0), (16, 66.0)])[1] is not None


def test_refining_adds_the_midpoints_on_both_sides_of_the_capacity_so_far() -> None:
    assert refine_points([1, 2, 4, 8], 4) == [3, 6]
    assert refine_points([1, 2, 4, 8, 16, 32], 16) == [12, 24]
    assert refine_points([1, 2], 1) == []  # a serial server: nothing between 1 and 2
    assert refine_points([1, 2, 4], 2) == [3]  # 1.5 is no whole number of users


def _points(*rows: tuple) -> list[_Measured]:
    return [_Measured(users, tps, None, interval=RateInterval(tps, tps - half, tps + half, 0.95, 4, 5.0)
                      if half is not None else None) for users, tps, half in rows]


def test_the_refining_points_go_around_the_capacity_not_the_last_rise() -> None:
    # Run 3 of the tenth hold (AVX2 box, 2026-12-07): 8 users did not rise 1.15x over 4 (nor, by that day's
    # rule, 16 1.32x over 4), so the last rise was 4 and 3 and 6 were filled in; the capacity rule then named 16
    # users with no 12-user point to weigh.
    doubled = _points((1, 22.6, None), (2, 39.3, None), (4, 61.0, None), (8, 63.2, None), (16, 74.6, None))
    assert refine_around(doubled) == 16
    assert refine_points([1, 2, 4, 8, 16], refine_around(doubled)) == [12]
    # Each point weighs by its precision: a heaviest point read to ±40 tok/s barely lifts the level the 90% is
    # taken of, so the capacity so far is 8 users (equal weights would pool 16 and 32 at 73 and name 16).
    noisy_top = [(1, 20.0, 2.0), (2, 38.0, 3.0), (4, 54.0, 4.0), (8, 64.0, 4.0), (16, 80.0, 40.0), (32, 66.0, 3.0)]
    assert refine_around(_points(*noisy_top)) == 8
    assert refine_around(_points(*((users, tps, None) for users, tps, _ in noisy_top))) == 16
    # With an SLO: around the most users whose SLO held, the lightest when none did.
    assert refine_around([_Measured(1, 20.0, True), _Measured(2, 38.0, True), _Measured(4, 50.0, False)]) == 2
    assert refine_around([_Measured(1, 20.0, False), _Measured(2, 30.0, False)]) == 1


def test_a_capacity_on_the_heaviest_point_gets_one_point_past_it() -> None:
    # The fifteenth hold's second run (AVX2 box, 2026-12-07): the doubling stopped at 16 users (8 and 16 not
    # 1.15x and 1.32x over 4's 60.7), 12 was filled in and read 67.8 against 16's 79.4, so 16 was the capacity
    # with nothing past it to tell what holds it.
    points = _points((1, 21.9, 2.8), (2, 38.1, 3.3), (4, 60.7, 4.8), (8, 67.4, 6.2), (16, 79.4, 14.5),
                     (12, 67.8, 16.0))
    assert refine_around(points) == 16
    assert point_past_the_top([p.users for p in points], 16, 32) == 24
    assert point_past_the_top([1, 2, 4, 8, 12, 16], 12, 32) is None  # a point past the capacity already
    assert point_past_the_top([1, 2, 4, 8, 16], 16, 16) is None  # --max-users: nothing may be added
    assert point_past_the_top([1, 2, 4, 8, 16], 16, 20) == 18


@pytest.mark.slow
def test_the_search_finds_the_knee_of_a_server_with_four_seats(tmp_path) -> None:
    out = tmp_path / "search"
    # NOTE: points of 8 s, not 4: at 4 s (2026-12-07, AVX2 box) one run's points past 4 users read
    # 72-78 ± 14-31 tok/s, which cannot be told apart, so the search rightly named no capacity.
    assert main(["diagnose", "--model", "dummy:tiny", "--max-num-seqs", "4", "--host-overhead-ms", STEP_MS,
                 *search_load(8), "--out", str(out)]) == 0
    diagnosis = json.loads((out / "diagnosis.json").read_text())
    capacity = diagnosis["capacity"]
    searched = sorted(p["users"] for p in capacity["points"])
    assert searched[:4] == [1, 2, 3, 4] and 8 in searched  # doubled, then filled in around the capacity
    assert capacity["knee"]["has_knee"], capacity["knee"]["reason"]
    index = searched.index(4)
    assert capacity["concurrency"] in searched[index - 1:index + 2]  # 4 users, give or take one point
    assert capacity["output_tokens_per_s"] > 0
    # One server served the whole search; each point's directory got exactly its own requests' rows.
    for point in capacity["points"]:
        check_nothing_lost(out / f"users-{point['users']}")
    assert (out / "report.html").read_text().count('id="capacity"') == 1


def _tokens_limit(tmp_path, name: str, engine_flags: list[str]) -> dict:
    server = ServerProcess(tmp_path / f"{name}-server",
                           ["--model", "dummy:tiny", "--host-overhead-ms", STEP_MS, *engine_flags])
    out = tmp_path / name
    with server:
        server.wait_healthy(120.0)
        assert main(["load", "--target", server.url, "--tokenizer", "dummy:tiny", *search_load(),
                     "--out", str(out)]) == 0
    return json.loads((out / "diagnosis.json").read_text())["capacity"]


@pytest.mark.slow
def test_the_tokens_experiment_tells_seats_from_memory(tmp_path) -> None:
    # Fixed requests: 128 prompt + 16 output tokens = 9 blocks of 16; 36 blocks hold 4 of them, and
    # 1 of the 3x requests (27 blocks); max_model_len 512 (32 blocks) lets so small a pool start.
    seats = _tokens_limit(tmp_path, "seats", ["--max-num-seqs", "4"])
    memory = _tokens_limit(tmp_path, "memory",
                           ["--max-num-seqs", "32", "--num-kv-blocks", "36", "--max-model-len", "512"])
    assert seats["tokens"] is not None and memory["tokens"] is not None
    assert seats["tokens"]["token_ratio"] > 2 and memory["tokens"]["token_ratio"] > 2
    assert seats["limit"] == "seats", seats["limit_evidence"]
    assert memory["limit"] == "memory", memory["limit_evidence"]


def _point(tmp_path, name: str, rows: list[tuple[bool, float, int]]):
    """A point directory whose client table holds ``(is_warmup, end_time, status_code)`` rows, sent at 0..n-1."""
    from loadtests.client.records import ClientRecord
    from loadtests.client.table import records_table
    from probes.run_dir import CLIENT_TABLE, RunDirectory

    records = [ClientRecord(worker="w0", seq=i, plan_index=i, group="", is_warmup=warm, send_time=float(i),
                            first_token_time=float(i) + 1.0, end_time=end, status_code=code,
                            finish_reason="length" if code == 200 else None, num_output_tokens=32)
               for i, (warm, end, code) in enumerate(rows)]
    directory = RunDirectory(tmp_path / name)
    directory.path.mkdir(parents=True)
    directory.write_table(CLIENT_TABLE, records_table(records))
    return directory.path


def test_a_point_whose_every_request_outlasts_it_is_overloaded_not_broken(tmp_path) -> None:
    from loadtests.capacity import overloaded_point

    # transformers serve --continuous-batching at 32 users: the 32 first requests took 28-42 s, past the 25 s point.
    slow = _point(tmp_path, "slow", [(True, 28.0 + i * 0.4, 200) for i in range(32)])
    why = overloaded_point(slow)
    assert why is not None and "all 32 requests were sent in the warm-up" in why and "all succeeded" in why
    # A failure, or any request measured after the warm-up, is not that: the ordinary health rules judge it.
    assert overloaded_point(_point(tmp_path, "failed", [(True, 28.0, 200), (True, 29.0, 503)])) is None
    assert overloaded_point(_point(tmp_path, "measured", [(True, 3.0, 200), (False, 9.0, 200)])) is None
    assert overloaded_point(tmp_path / "never-ran") is None


def test_a_search_whose_first_point_measured_nothing_says_so(tmp_path) -> None:
    import io

    from rich.console import Console

    from loadtests.capacity import search_capacity
    from loadtests.config import LoadConfig
    from loadtests.errors import RunFailedError

    def run_at(config: LoadConfig, run_dir) -> None:  # noqa: ANN001 - a Path
        # A starved server (2026-12-06, a busy 2-core box): 1 user's one request took 79 s, past the point.
        _point(run_dir.parent, run_dir.name, [(True, 79.0, 200)])

    out = tmp_path / "search"
    base = LoadConfig(users=1, duration_s=20.0, warmup_s=10.0, workload="fixed")
    with pytest.raises(RunFailedError, match="measured nothing: its first point, users-1, was overloaded"):
        search_capacity(base, out, run_at, Console(file=io.StringIO()), probed=True)
    search = json.loads((out / "capacity.json").read_text())
    assert search["order"] == [] and "nothing was measured" in search["stopped"]
