"""Headless runs: plan, Locust, merge, per load point; a sweep is several points into one directory.

``run_diagnose`` starts our server (probed) per point; ``run_load`` drives any OpenAI-compatible
server and scrapes its ``/metrics`` when it has one. Both finish with :func:`loadtests.run.finish.finish_run`.

With one point, ``OUT`` is the run directory; with ``--sweep``, ``OUT/sweep.json`` lists the
points and each has its own run directory ``OUT/users-4/`` (and so on); :mod:`probes.run_dir`
describes the files in each.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from loadtests.capacity import search_capacity, verdict_users
from loadtests.client.table import merge_journals, take_worker_roster
from loadtests.config import DEFAULT_MAX_USERS, LoadConfig
from loadtests.plan import build_plan, write_plan
from loadtests.point_stop import PointController
from loadtests.run.finish import Summary, finish_run
from loadtests.run.locust_runner import run_locust
from loadtests.run.progress import LoadProgress
from loadtests.run.server_process import ServerProcess
from loadtests.run.target import Target, discover_target, is_this_machine, probe_request
from loadtests.workloads.catalog import TokenizerLike
from loadtests.workloads.tokenizer import DEFAULT_TOKENIZER, is_known_model, load_tokenizer
from probes.loader import load_run
from probes.peaks import measure_peaks
from probes.run_dir import (
    CALIBRATION_NAME,
    LOAD_NAME,
    MANIFEST_NAME,
    PEAKS_NAME,
    PLAN_NAME,
    REPORT_NAME,
    SERVER_LOG_NAME,
    SWEEP_NAME,
    LoadInfo,
    RunDirectory,
    SweepIndex,
    SweepPoint,
)
from probes.schemas import TABLE_SCHEMAS
from probes.server_info import SERVER_INFO_NAME, fetch_server_info

if TYPE_CHECKING:
    from probes.session import ProbeSession

SERVER_STARTUP_TIMEOUT_S = 600.0
# The column that places each engine-side table's rows in time (split_server_run).
TIME_COLUMNS = {"steps": "start_time", "requests": "arrival_time", "host": "time", "nvml": "time",
                "prometheus": "time"}


def run_point(config: LoadConfig, target: Target, run_dir: Path, tokenizer: TokenizerLike, console: Console,
              load_info: LoadInfo, api_key: str | None = None) -> None:
    """One load point into ``run_dir``: plan, Locust headless, merged client rows, ``load.json``."""
    plan = build_plan(config, tokenizer, target.max_model_len)
    write_plan(run_dir / PLAN_NAME, plan)
    directory = RunDirectory(run_dir)
    info = dataclasses.replace(load_info, config=config.to_dict(), target=target.url, model=target.model,
                               max_model_len=target.max_model_len, num_planned_requests=len(plan),
                               started_at=time.time())
    directory.save(LOAD_NAME, info)
    controller = PointController(config, run_dir) if config.stop_rule is not None else None
    with LoadProgress(console, config.point_name, run_dir, config.warmup_s, config.duration_s,
                      target.metrics_url, phase=controller.phase if controller is not None else None) as progress:

        def tick(elapsed_s: float) -> None:
            if controller is not None:
                controller.tick()
            progress.tick(elapsed_s)

        try:
            locust = run_locust(config, target.url, run_dir, target.model, on_tick=tick, api_key=api_key)
        finally:
            if controller is not None:
                controller.finish()
        progress.tick(locust.wall_s)
    merge_journals(run_dir)
    roster = take_worker_roster(run_dir)
    directory.save(LOAD_NAME, dataclasses.replace(info, finished_at=time.time(), locust_returncode=locust.returncode,
                                                  locust_wall_s=locust.wall_s,
                                                  workers=roster.workers if roster is not None else None,
                                                  window=controller.window.to_dict() if controller else None))


def run_diagnose(configs: list[LoadConfig], out: Path, serve_argv: list[str], model: str, console: Console,
                 sweep: tuple[str, list[float]] | None = None) -> Summary:
    """Each point: start our probed server on a free port, wait for /health, load it, stop it; then summarize."""
    point_dirs = _prepare_out(out, configs, sweep)
    with console.status("measuring this machine's peak bandwidth and FLOP/s before the load"):
        peaks = measure_peaks()
    for run_dir in point_dirs:
        RunDirectory(run_dir).write_peaks(peaks)
    # NOTE: before any server starts, not while it starts: a server measures the peaks its run directory lacks
    # (another dtype) before its engine, and the tokenizer's load beside it took a core of two from the copy.
    tokenizer = load_tokenizer(model)
    for config, run_dir in zip(configs, point_dirs, strict=True):
        RunDirectory(run_dir).save(LOAD_NAME, LoadInfo(config=config.to_dict()))
        argv = ["--workload-json", str(run_dir / LOAD_NAME), "--workload-seed", str(config.seed), *serve_argv]
        with ServerProcess(run_dir, argv) as server:
            label = f"[bold]{config.point_name}[/]: starting the server ({model})"
            with console.status(label) as status:
                server.wait_healthy(SERVER_STARTUP_TIMEOUT_S,
                                    lambda elapsed, label=label, status=status: status.update(f"{label}, {elapsed:.0f} s"))
            target = discover_target(server.url)
            run_point(config, target, run_dir, tokenizer, console,
                      LoadInfo(config={}, server="servescope (probed)", serve_argv=serve_argv, server_pid=server.pid))
            with console.status(f"[bold]{config.point_name}[/]: stopping the server, writing the probes"):
                returncode = server.stop()
        if returncode != 0:
            console.print(f"[yellow]warning:[/] the server exited with status {returncode}; see {server.log_path}")
    return finish_run(out, console)


def run_ablation(config: LoadConfig, out: Path, serve_argv: list[str], model: str, console: Console) -> dict:
    """The same load point once per lever switched off (reports.ablation.STANDARD_VARIANTS), side by side.

    Each variant is a full diagnose run in ``out/<variant>/``; then ``out/ablation.json`` and one
    report over all of them. NOTE: a variant's serve flags come last, so they override the user's.
    """
    from reports import write_report
    from reports.ablation import STANDARD_VARIANTS, write_ablation_index

    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; give --out a new directory")
    for variant in STANDARD_VARIANTS:
        console.rule(f"ablation: {variant.name} ({variant.description})")
        run_diagnose([config], out / variant.dir, [*serve_argv, *variant.serve_flags], model, console)
    write_ablation_index(out, STANDARD_VARIANTS)
    diagnosis = write_report(out)
    console.print(f"ablation report: {out / REPORT_NAME}")
    return diagnosis


def run_load(configs: list[LoadConfig], out: Path, url: str, console: Console,
             sweep: tuple[str, list[float]] | None = None, tokenizer_name: str | None = None,
             served_model: str | None = None, api_key: str | None = None,
             search: SearchOptions | None = None, reference: bool = True) -> Summary:
    """Each point against an external server; its /metrics (when served) and this host are probed.

    With ``search`` (and one config, whose users are ignored), the points are a capacity search's.
    ``reference=False`` skips :func:`time_reference` (a second server start and its timed steps).
    """
    target = discover_target(url, served_model, api_key)
    probe = probe_request(target, configs[0].api, configs[0].ignore_eos, api_key)
    if probe.dropped_fields:
        console.print(f"[yellow]note:[/] {target.url} refuses {', '.join(probe.dropped_fields)}; the load goes on "
                      f"without it (recorded in load.json and run.json)")
        configs = [dataclasses.replace(c, ignore_eos=False) for c in configs]
    name = tokenizer_name_for(target, tokenizer_name)
    if tokenizer_name is None and name != target.model:
        console.print(f"[yellow]note:[/] no tokenizer for {target.model!r} here; prompts are cut with {name}'s "
                      f"(the server's own count is in each row's num_prompt_tokens); pass --tokenizer to change it")
    tokenizer = load_tokenizer(name)

    def run_at(config: LoadConfig, run_dir: Path) -> None:
        session = start_external_probes(run_dir, target, config, dropped_fields=probe.dropped_fields)
        RunDirectory(run_dir).save(SERVER_INFO_NAME, fetch_server_info(target.url, api_key))
        error: BaseException | None = None
        try:
            run_point(config, target, run_dir, tokenizer, console,
                      LoadInfo(config={}, server="external", tokenizer=name, metrics_url=target.metrics_url,
                               dropped_fields=list(probe.dropped_fields)), api_key)
        except BaseException as exc:
            error = exc
            raise
        finally:
            session.stop(error=error)

    if search is not None:
        if out.exists() and any(out.iterdir()):
            raise ValueError(f"{out} is not empty; give --out a new directory")
        is_local = is_this_machine(target.url)
        peaks = None
        if is_local:
            # NOTE: measured before any load, while the target idles: the roof a single stream is held to.
            from probes.peaks import measure_peaks

            with console.status("measuring this machine's memory bandwidth (the target runs here)"):
                peaks = measure_peaks("auto")
        done = search_capacity(configs[0], out, run_at, console, max_users=search.max_users,
                               model_bytes=search.model_bytes, is_local=is_local, peaks=peaks)
        if reference:
            time_reference(out / f"users-{verdict_users(out, done)}", target, console, api_key,
                           ignore_eos=configs[0].ignore_eos)
        return finish_run(out, console)
    for config, run_dir in zip(configs, _prepare_out(out, configs, sweep), strict=True):
        run_at(config, run_dir)
    if reference:
        if sweep is None:
            take_single_stream(out, target, configs[0], console, api_key)
        time_reference(out if sweep is None else out / configs[-1].point_name, target, console, api_key,
                       ignore_eos=configs[-1].ignore_eos)
    return finish_run(out, console)


def take_single_stream(run_dir: Path, target: Target, config: LoadConfig, console: Console,
                       api_key: str | None) -> None:
    """After a one-point load: its first planned requests alone (``single_stream.json``), the lighter load its
    TPOT and its failures are read against."""
    from loadtests.run.single_stream import measure_single_stream

    with console.status("timing a single stream after the load (the reference its TPOT and failures are read against)"):
        reference = measure_single_stream(run_dir, target, config.api, config.ignore_eos, api_key)
    tpot = reference.tpot_p50_s
    console.print(f"single-stream reference: {reference.num_requests - reference.num_failed} of "
                  f"{reference.num_requests} requests ok" + (f", TPOT {tpot * 1000:.1f} ms" if tpot else ""))


def time_reference(run_dir: Path, target: Target, console: Console, api_key: str | None, ignore_eos: bool) -> None:
    """After the load, for a target on this machine serving weights servescope can load: its decode step
    against ``servescope serve``'s on the same weights, in turns (``execution_reference.json``, the
    outside execution evidence)."""
    from loadtests.run.execution_reference import (
        http_target_step,
        measure_served_reference,
        reference_weights,
    )

    weights = reference_weights(target.model)
    if not is_this_machine(target.url) or weights is None:
        return
    try:
        with console.status(f"timing the target's decode step against servescope serve on {weights}"):
            measure_served_reference(run_dir, weights, http_target_step(target.url, target.model, api_key, ignore_eos),
                                     lambda url: http_target_step(url, weights))
    except Exception as exc:  # noqa: BLE001 - the run stands; the verdict says execution was not timed
        console.print(f"[yellow]note:[/] timing the target's decode step failed ({type(exc).__name__}: {exc}); "
                      f"execution is not judged from outside")


def run_diagnose_search(base: LoadConfig, out: Path, serve_argv: list[str], model: str, console: Console,
                        search: SearchOptions) -> Summary:
    """A capacity search against one probed server kept alive across its points (a restart per point
    costs a model load); its probe tables are then cut into each point's run directory."""
    server_dir = out.parent / f".{out.name}-server"
    if server_dir.exists():
        raise ValueError(f"{server_dir} exists; remove it or pick another --out")
    # NOTE: the load's workload and how far its users go, so the server's step calibration is taken at this
    # load's typical context and prompt step
    workload = out.parent / f".{out.name}-workload.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    workload.write_text(json.dumps({"config": base.to_dict(), "max_users": search.max_users}))
    argv = ["--workload-json", str(workload), "--workload-seed", str(base.seed), *serve_argv]
    point_dirs: list[Path] = []
    # NOTE: before the server starts, not while it starts: the server measures this machine's copy bandwidth
    # before its engine, and the tokenizer loading beside it (seconds of one core) halved it on a 2-core machine
    # (17.0 against 31-38 GB/s measured alone, AMD EPYC, 2026-12-07): every bandwidth share and roofline floor
    # of the run was twice what it should have been.
    tokenizer = load_tokenizer(model)
    try:
        with ServerProcess(server_dir, argv) as server:
            label = f"starting the server ({model})"
            with console.status(label) as status:
                server.wait_healthy(SERVER_STARTUP_TIMEOUT_S,
                                    lambda elapsed: status.update(f"{label}, {elapsed:.0f} s"))
            target = discover_target(server.url)

            def run_at(config: LoadConfig, run_dir: Path) -> None:
                run_dir.mkdir(parents=True, exist_ok=True)
                point_dirs.append(run_dir)
                run_point(config, target, run_dir, tokenizer, console,
                          LoadInfo(config={}, server="servescope (probed)", serve_argv=serve_argv,
                                   server_pid=server.pid))

            search_capacity(base, out, run_at, console, max_users=search.max_users,
                            model_bytes=search.model_bytes, is_local=True, probed=True)
            with console.status("stopping the server, writing the probes"):
                returncode = server.stop()
        if returncode != 0:
            console.print(f"[yellow]warning:[/] the server exited with status {returncode}; see {server.log_path}")
        split_server_run(server_dir, point_dirs)
        shutil.copyfile(server_dir / SERVER_LOG_NAME, out / SERVER_LOG_NAME)
        if (server_dir / PEAKS_NAME).is_file():
            shutil.copyfile(server_dir / PEAKS_NAME, out / PEAKS_NAME)
    finally:
        shutil.rmtree(server_dir, ignore_errors=True)
        workload.unlink(missing_ok=True)
    return finish_run(out, console)


def split_server_run(server_dir: Path, point_dirs: list[Path]) -> None:
    """Cut the probe tables of one server kept alive across several load points into each point's run directory.

    Each point's directory gets the rows that fall inside its load (``load.json``'s ``started_at`` to
    ``finished_at``), a ``run.json`` naming its own load, and the server's ``machine_peaks.json``, so it
    reads as if it had had its own server.
    """
    run = load_run(server_dir)
    for point_dir in point_dirs:
        point = RunDirectory(point_dir)
        info = point.load_info()
        if info is None or info.started_at is None or info.finished_at is None:
            raise ValueError(f"{point_dir} has no finished load in {LOAD_NAME}, so its rows cannot be placed")
        for name, frame in run.frames.items():
            column = TIME_COLUMNS.get(name)
            if column is None:
                raise ValueError(f"{server_dir}: table {name!r} has no time column to split it by")
            inside = frame[(frame[column] >= info.started_at) & (frame[column] <= info.finished_at)]
            point.write_frame(name, inside, TABLE_SCHEMAS[name])
        manifest = run.manifest
        manifest.workload = info.to_dict()
        manifest.started_at, manifest.stopped_at = info.started_at, info.finished_at
        point.write_json(MANIFEST_NAME, manifest.to_dict())
        for name in (PEAKS_NAME, CALIBRATION_NAME):  # measured once, before the server served any point
            if (server_dir / name).is_file():
                shutil.copyfile(server_dir / name, point_dir / name)


@dataclasses.dataclass(slots=True, frozen=True)
class SearchOptions:
    """How far a capacity search may go, and what it knows of the model."""

    max_users: int = DEFAULT_MAX_USERS
    model_bytes: int | None = None


def tokenizer_name_for(target: Target, tokenizer_name: str | None = None) -> str:
    """The tokenizer to cut prompts with: the one asked for, else the served model's own when known, else the default."""
    if tokenizer_name is not None:
        return tokenizer_name
    return target.model if is_known_model(target.model) else DEFAULT_TOKENIZER


def start_external_probes(run_dir: Path, target: Target, config: LoadConfig, pid: int | None = None,
                          dropped_fields: tuple[str, ...] = ()) -> ProbeSession:
    """A new run directory with this host (and process ``pid``, default this one) probed, and the
    target's ``/metrics`` scraped when it serves them; ``dropped_fields`` go into run.json's workload."""
    from probes.host import HostProbe
    from probes.manifest import RunManifest
    from probes.model_shape import resolve_model_shape
    from probes.prometheus import PrometheusProbe
    from probes.session import ProbeSession

    run = RunDirectory.create(run_dir)
    probes: list[Any] = [HostProbe(run, pid=pid)]
    if target.metrics_url is not None:
        probes.append(PrometheusProbe(run, target.metrics_url))
    workload = {**config.to_dict(), "dropped_fields": list(dropped_fields)}
    manifest = RunManifest.collect(model=target.model, workload=workload, seeds={"workload": config.seed},
                                   model_shape=resolve_model_shape(target.model))
    session = ProbeSession(run, probes, manifest)
    session.start()
    return session


def _prepare_out(out: Path, configs: list[LoadConfig], sweep: tuple[str, list[float]] | None) -> list[Path]:
    """The run directory of each point; refuses an ``out`` that already holds anything."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty; give --out a new directory")
    out.mkdir(parents=True, exist_ok=True)
    if sweep is None:
        if len(configs) != 1:
            raise ValueError("several load points need a sweep")
        return [out]
    parameter, values = sweep
    dirs = [out / config.point_name for config in configs]
    RunDirectory(out).save(SWEEP_NAME, SweepIndex(parameter, [SweepPoint(v, d.name)
                                                              for v, d in zip(values, dirs, strict=True)]))
    for d in dirs:
        d.mkdir()
    return dirs

