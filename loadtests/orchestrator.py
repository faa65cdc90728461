"""Headless runs: plan, Locust, merge, per load point; a sweep is several points into one directory.

``run_diagnose`` starts our server (probed) per point; ``run_load`` drives any OpenAI-compatible
server and scrapes its ``/metrics`` when it has one. Both finish with :func:`loadtests.summary.write_summary`.

Directory layout: with one point, ``OUT`` is the run directory; with ``--sweep``, ``OUT/sweep.json``
lists the points and each has its own run directory ``OUT/users-4/`` (and so on)::

    run.json, steps.parquet, requests.parquet, ...   the probes (probes.session)
    load.json                                        the load config, target and model
    workload.jsonl                                   the request plan (loadtests.plan)
    client_requests.parquet                          one client row per request, every worker merged
    locust_stats.csv, locust_stats_history.csv, locust.html, locust.log, server.log
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from loadtests.client_table import merge_journals
from loadtests.config import LoadConfig
from loadtests.errors import ReportFailedError
from loadtests.locust_runner import run_locust
from loadtests.plan import PLAN_NAME, build_plan, write_plan
from loadtests.progress import LoadProgress, summary_table
from loadtests.server_process import ServerProcess
from loadtests.summary import LOAD_NAME, SWEEP_NAME, Summary, write_summary
from loadtests.tokenizer import DEFAULT_TOKENIZER, is_known_model, load_tokenizer
from loadtests.workloads import TokenizerLike
from probes.run_dir import RunDirectory

if TYPE_CHECKING:
    from probes.session import ProbeSession

SERVER_STARTUP_TIMEOUT_S = 600.0


@dataclass(slots=True, frozen=True)
class Target:
    """The server under load, as its own endpoints describe it."""

    url: str
    model: str
    max_model_len: int | None
    has_metrics: bool

    @property
    def metrics_url(self) -> str | None:
        return f"{self.url}/metrics" if self.has_metrics else None


def discover_target(url: str, served_model: str | None = None, api_key: str | None = None) -> Target:
    """Ask ``url`` for its models (``/v1/models``) and whether it serves Prometheus ``/metrics``."""
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        models = _get_json(f"{url}/v1/models", headers)["data"]
    except (urllib.error.URLError, OSError, KeyError, ValueError) as exc:
        raise ValueError(f"{url} does not answer GET /v1/models as an OpenAI-compatible server: {exc}") from exc
    names = [m.get("id") for m in models]
    if served_model is not None:
        if served_model not in names:
            raise ValueError(f"{url} does not serve {served_model!r}; it serves {names}")
        card = models[names.index(served_model)]
    elif models:
        card = models[0]
    else:
        raise ValueError(f"{url} lists no models at /v1/models")
    max_len = card.get("max_model_len")
    return Target(url, str(card["id"]), int(max_len) if isinstance(max_len, int) else None, _has_metrics(url))


def run_point(config: LoadConfig, target: Target, run_dir: Path, tokenizer: TokenizerLike, console: Console,
              load_info: dict[str, Any], api_key: str | None = None) -> None:
    """One load point into ``run_dir``: plan, Locust headless, merged client rows, ``load.json``."""
    plan = build_plan(config, tokenizer, target.max_model_len)
    write_plan(run_dir / PLAN_NAME, plan)
    info = {**load_info, "target": target.url, "model": target.model, "max_model_len": target.max_model_len,
            "plan": {"file": PLAN_NAME, "num_requests": len(plan)}, "started_at": time.time()}
    _write_json(run_dir, LOAD_NAME, {"config": config.to_dict(), **info})
    with LoadProgress(console, config.point_name, run_dir, config.warmup_s, config.duration_s,
                      target.metrics_url) as progress:
        locust = run_locust(config, target.url, run_dir, target.model, on_tick=progress.tick, api_key=api_key)
        progress.tick(locust.wall_s)
    merge_journals(run_dir)
    info.update(finished_at=time.time(), locust={"returncode": locust.returncode, "wall_s": locust.wall_s})
    _write_json(run_dir, LOAD_NAME, {"config": config.to_dict(), **info})


def run_diagnose(configs: list[LoadConfig], out: Path, serve_argv: list[str], model: str, console: Console,
                 sweep: tuple[str, list[float]] | None = None) -> Summary:
    """Each point: start our probed server on a free port, wait for /health, load it, stop it; then summarize."""
    point_dirs = _prepare_out(out, configs, sweep)
    tokenizer: TokenizerLike | None = None
    for config, run_dir in zip(configs, point_dirs, strict=True):
        _write_json(run_dir, LOAD_NAME, {"config": config.to_dict()})
        argv = ["--workload-json", str(run_dir / LOAD_NAME), "--workload-seed", str(config.seed), *serve_argv]
        with ServerProcess(run_dir, argv) as server:
            # NOTE: the tokenizer loads while the server loads its model (both take seconds).
            if tokenizer is None:
                tokenizer = load_tokenizer(model)
            label = f"[bold]{config.point_name}[/]: starting the server ({model})"
            with console.status(label) as status:
                server.wait_healthy(SERVER_STARTUP_TIMEOUT_S,
                                    lambda elapsed, label=label, status=status: status.update(f"{label}, {elapsed:.0f} s"))
            target = discover_target(server.url)
            run_point(config, target, run_dir, tokenizer, console,
                      {"server": "servescope (probed)", "serve_argv": serve_argv, "server_pid": server.pid})
            with console.status(f"[bold]{config.point_name}[/]: stopping the server, writing the probes"):
                returncode = server.stop()
        if returncode != 0:
            console.print(f"[yellow]warning:[/] the server exited with status {returncode}; see {server.log_path}")
    return _finish(out, console)


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
    console.print(f"ablation report: {out / 'report.html'}")
    return diagnosis


def run_load(configs: list[LoadConfig], out: Path, url: str, console: Console,
             sweep: tuple[str, list[float]] | None = None, tokenizer_name: str | None = None,
             served_model: str | None = None, api_key: str | None = None) -> Summary:
    """Each point against an external server; its /metrics (when served) and this host are probed."""
    target = discover_target(url, served_model, api_key)
    name = tokenizer_name_for(target, tokenizer_name)
    if tokenizer_name is None and name != target.model:
        console.print(f"[yellow]note:[/] no tokenizer for {target.model!r} here; prompts are cut with {name}'s "
                      f"(the server's own count is in each row's num_prompt_tokens); pass --tokenizer to change it")
    tokenizer = load_tokenizer(name)
    for config, run_dir in zip(configs, _prepare_out(out, configs, sweep), strict=True):
        session = start_external_probes(run_dir, target, config)
        error: BaseException | None = None
        try:
            run_point(config, target, run_dir, tokenizer, console,
                      {"server": "external", "tokenizer": name, "metrics_url": target.metrics_url}, api_key)
        except BaseException as exc:
            error = exc
            raise
        finally:
            session.stop(error=error)
    return _finish(out, console)


def tokenizer_name_for(target: Target, tokenizer_name: str | None = None) -> str:
    """The tokenizer to cut prompts with: the one asked for, else the served model's own when known, else the default."""
    if tokenizer_name is not None:
        return tokenizer_name
    return target.model if is_known_model(target.model) else DEFAULT_TOKENIZER


def start_external_probes(run_dir: Path, target: Target, config: LoadConfig, pid: int | None = None) -> ProbeSession:
    """A new run directory with this host (and process ``pid``, default this one) probed, and the
    target's ``/metrics`` scraped when it serves them."""
    from probes.host import HostProbe
    from probes.manifest import RunManifest
    from probes.prometheus import PrometheusProbe
    from probes.session import ProbeSession

    run = RunDirectory.create(run_dir)
    probes: list[Any] = [HostProbe(run, pid=pid)]
    if target.metrics_url is not None:
        probes.append(PrometheusProbe(run, target.metrics_url))
    manifest = RunManifest.collect(model=target.model, workload=config.to_dict(), seeds={"workload": config.seed})
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
    _write_json(out, SWEEP_NAME, {"parameter": parameter, "values": values,
                                  "points": [{"value": v, "dir": d.name} for v, d in zip(values, dirs, strict=True)]})
    for d in dirs:
        d.mkdir()
    return dirs


def _finish(out: Path, console: Console) -> Summary:
    try:
        summary = write_summary(out)
    except Exception as exc:  # noqa: BLE001 - the run itself is safe on disk; say how to retry
        raise ReportFailedError(f"the run in {out} is complete, but writing its report failed: "
                                f"{type(exc).__name__}: {exc}; rerun `servescope report {out}`") from exc
    metrics = summary.metrics
    console.print(summary_table(metrics))
    for point in metrics.get("points", [metrics]):
        accounting = point["accounting"]
        if not accounting["is_consistent"]:
            console.print(f"[yellow]warning:[/] {point['point']}: the request counts disagree: {accounting}")
    console.print(f"bottleneck: [bold]{summary.diagnosis.get('bottleneck')}[/]; wrote {out / 'diagnosis.json'} "
                  f"and {out / 'report.html'}")
    return summary


def _write_json(directory: Path, name: str, obj: Any) -> None:
    RunDirectory(directory).write_json(name, obj)


def _get_json(url: str, headers: dict[str, str]) -> Any:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=10.0) as response:  # noqa: S310 - the target URL we were given
        return json.loads(response.read())


def _has_metrics(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as response:  # noqa: S310 - as above
            return response.status == 200 and b"# TYPE" in response.read(1 << 20)
    except (urllib.error.URLError, OSError):
        return False
