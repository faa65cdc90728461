"""The facts the verdict reads at one load point: every measure the rules need, from the engine's probes
inside the server or only what a client of it has; the sweep's evidence across points."""

from __future__ import annotations

from probes.execution_paths import OPTIMIZED, PathTiming, decode_shape
from probes.run_dir import CALIBRATION_NAME, EXECUTION_REFERENCE_NAME, RunDirectory
from probes.server_info import SERVER_INFO_NAME, ServerInfo
from probes.single_stream import SingleStream
from probes.step_calibration import StepCalibration
from reports.dataset import RunDataset
from reports.failures import failure_counts
from reports.roofline import roofline_summary, step_work
from reports.summary import PointMeasures
from reports.verdict.evidence import Facts, SweepMeasures

# Which evidence a verdict may read: all of it, or only what a client of the server has (its
# timings, its /metrics, and what servescope measured on this machine itself), as `load --target` sees it.
VIEWS = ("inside", "outside")


def facts_for(data: RunDataset, measures: PointMeasures, sweep: SweepMeasures | None = None,
              view: str = "inside", single_stream_tpot_s: float | None = None) -> Facts:
    """Every measure of one load point the rules read; with ``view="outside"`` only what a client has.

    ``single_stream_tpot_s``: one stream's median TPOT in the same run (see :func:`single_stream_tpot`).
    """
    if view not in VIEWS:
        raise ValueError(f"view must be one of {VIEWS}, got {view!r}")
    directory = RunDirectory(data.path)
    is_metrics_unread = data.has_prometheus and measures.prometheus is None
    failures = failure_counts(data.latencies) if measures.client is not None else None
    if view == "outside" or measures.server is None:
        return Facts(server=None, client=measures.client, prometheus=measures.prometheus, roofline=None, sweep=sweep,
                     is_metrics_unread=is_metrics_unread,
                     execution_reference=directory.load(EXECUTION_REFERENCE_NAME, PathTiming),
                     failures=failures, single_stream_tpot_s=single_stream_tpot_s,
                     server_info=directory.load(SERVER_INFO_NAME, ServerInfo))
    roofline = None
    shape = data.model_shape
    if shape is not None:
        roofline = roofline_summary(step_work(data.steps_in_window(), shape), shape, data.peaks)
    return Facts(server=measures.server, client=measures.client, prometheus=measures.prometheus,
                 roofline=roofline, engine_config=data.engine_config, sweep=sweep,
                 is_metrics_unread=is_metrics_unread,
                 execution_paths=run_path_timing(directory, data), failures=failures,
                 single_stream_tpot_s=single_stream_tpot_s)


def run_path_timing(directory: RunDirectory, data: RunDataset) -> PathTiming | None:
    """Both execution paths' decode step at the run's median decode batch, read off the step calibration
    the server measured before the load (the one measurement the predictions read too)."""
    calibration = directory.load(CALIBRATION_NAME, StepCalibration)
    shape = decode_shape(data.steps_in_window())
    # NOTE: an optimized run has no other path to time (eager is slower, not a lever): its own path is the timing
    if calibration is None or shape is None or OPTIMIZED not in calibration.step_s:
        return None
    return calibration.path_timing(*shape)


def single_stream_tpot(measures: list[PointMeasures], reference: SingleStream | None) -> float | None:
    """One stream's median TPOT in this run: its 1-user point's (a capacity search, a sweep), else the
    single-stream reference a one-point run took after its load."""
    for m in measures:
        if m.load.get("users") == 1 and m.client is not None and m.client.tpot_s:
            return m.client.tpot_s["p50"]
    return reference.tpot_p50_s if reference is not None else None


def sweep_measures(parameter: str, points: list[PointMeasures]) -> SweepMeasures | None:
    """Lightest vs heaviest point of a sweep (points ordered by load), from their client measures."""
    low, high = points[0], points[-1]
    if low.concurrency is None or high.concurrency is None or low.client is None or high.client is None:
        return None
    lc, hc = low.client, high.client

    def ratio(a: float | None, b: float | None) -> float | None:
        return b / a if a and b is not None else None

    def p50(dist: dict[str, float] | None) -> float | None:
        return dist["p50"] if dist else None

    return SweepMeasures(parameter=parameter, low=low.concurrency, high=high.concurrency,
                         throughput_ratio=ratio(lc.output_throughput, hc.output_throughput),
                         ttft_ratio=ratio(p50(lc.ttft_s), p50(hc.ttft_s)),
                         tpot_ratio=ratio(p50(lc.tpot_s), p50(hc.tpot_s)))
