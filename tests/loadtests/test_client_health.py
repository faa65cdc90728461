"""Each load worker samples its own event-loop lag and CPU; the samples merge beside the client rows."""

from __future__ import annotations

import time

import gevent
import pyarrow.parquet as pq

from loadtests.client.health import HealthSampler, health_path
from loadtests.client.records import Clock, LineFile
from loadtests.client.table import merge_journals
from probes.run_dir import CLIENT_HEALTH_TABLE, RunDirectory
from probes.schemas import CLIENT_HEALTH


def _burn(seconds: float) -> None:
    """Hold the CPU (and the event loop) without yielding to any greenlet."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_blocked_event_loop_reads_as_lag_and_cpu(tmp_path) -> None:
    sampler = HealthSampler(LineFile(health_path(tmp_path, "w0")), "w0", Clock(), interval_s=0.05)
    sampler.start()
    gevent.sleep(0.3)  # idle: the sampler wakes on time
    _burn(0.5)  # what a saturated client does to every greenlet, the token readers' included
    gevent.sleep(0.2)
    sampler.stop()
    merge_journals(tmp_path)
    assert not health_path(tmp_path, "w0").exists()
    samples = pq.read_table(RunDirectory(tmp_path).table_path(CLIENT_HEALTH_TABLE), schema=CLIENT_HEALTH).to_pandas()
    assert len(samples) == sampler.num_samples >= 4 and set(samples["worker"]) == {"w0"}
    assert samples["time"].is_monotonic_increasing
    worst = samples.loc[samples["loop_lag_s"].idxmax()]
    # The sample due during the burn woke when it ended: most of the 0.5 s late.
    assert worst["loop_lag_s"] >= 0.3
    idle = samples[samples["time"] < worst["time"] - 0.5]
    assert len(idle) >= 2 and idle["loop_lag_s"].max() < worst["loop_lag_s"] / 3
    # Its gap was spent burning CPU; the idle gaps were not.
    assert worst["cpu_share"] > 0.25 and idle["cpu_share"].median() < worst["cpu_share"] / 3


def test_a_torn_last_sample_is_dropped(tmp_path) -> None:
    path = health_path(tmp_path, "w1")
    path.write_text('{"worker":"w1","time":2.0,"loop_lag_s":0.001,"cpu_share":0.1}\n'
                    '{"worker":"w1","time":1.0,"loop_lag_s":0.002,"cpu_share":0.2}\n{"worker":"w1","ti')
    health_path(tmp_path, "w0").write_text('{"worker":"w0","time":1.5,"loop_lag_s":0.0,"cpu_share":0.3}\n')
    merge_journals(tmp_path)
    samples = pq.read_table(RunDirectory(tmp_path).table_path(CLIENT_HEALTH_TABLE)).to_pandas()
    assert list(samples["time"]) == [1.0, 1.5, 2.0] and list(samples["worker"]) == ["w1", "w0", "w1"]
