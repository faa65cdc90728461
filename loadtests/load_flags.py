"""The load flags of ``load`` and ``diagnose`` and the load configs they give: the same flags on both, with
each command's defaults (``DIAGNOSE_DEFAULTS``, ``LOAD_DEFAULTS``), ``--master`` for a load from many machines, and
whether a command searches for the capacity (:func:`is_search`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from loadtests.config import (
    APIS,
    DEFAULT_MASTER_BIND_HOST,
    DEFAULT_MASTER_PORT,
    DEFAULT_MAX_USERS,
    DEFAULT_WORKER_WAIT_S,
    LoadConfig,
    MasterConfig,
    StopRule,
    parse_slo,
    parse_sweep,
)
from loadtests.workloads.catalog import WORKLOADS, is_trace
from loadtests.workloads.traces import SAMPLES, read_trace, trace_path

# `servescope diagnose` with no flags: the bundled model, a chat-like workload cut to short answers, and
# a capacity search whose points are capped to finish in about 6 minutes on 2 CPU cores (8 points of at
# most 10 s warm-up, 30 s while its first requests run, + 20 s measured + the drain). ``users``, ``duration``,
# ``warmup``: a single point's (--users, --ablate); ``search_*``: each search point's caps and --interval.
DIAGNOSE_DEFAULTS = {"users": 8, "duration": 60.0, "warmup": 10.0, "workload": "sharegpt-synth", "max_tokens": 64,
                     "search_duration": 20.0, "search_warmup": 10.0, "search_interval": 5.0}
LOAD_DEFAULTS = {"users": 8, "duration": 60.0, "warmup": 10.0, "workload": "sharegpt-synth", "max_tokens": None,
                 "search_duration": 45.0, "search_warmup": 20.0, "search_interval": 5.0}
# diagnose searches up to this many times the engine's seats (--max-num-seqs) unless --max-users says
SEATS_MULTIPLE = 2
# A trace run lasts until its last arrival plus this, so the last request is inside the deadline.
TRACE_TAIL_S = 1.0


def add_load_args(parser: argparse.ArgumentParser, defaults: dict[str, Any], with_seed: bool = True) -> None:
    """The load flags, the same on ``load`` and ``diagnose``."""
    g = parser.add_argument_group("load")
    arrival = g.add_mutually_exclusive_group()
    arrival.add_argument("--users", type=int, default=None,
                         help="closed loop: N users, each sends when its last request ends (default: search for the "
                              "server's capacity, doubling users from 1 while output throughput rises)")
    arrival.add_argument("--rate", type=float, default=None,
                         help="open loop: Poisson arrivals at R requests/s, whatever the server does")
    g.add_argument("--duration", type=float, default=None,
                   help=f"seconds of measured load after the warm-up, per point (default {defaults['duration']:g}; "
                        f"a trace: until its last request); with --interval the most a point measures (a capacity "
                        f"search: {defaults['search_duration']:g})")
    g.add_argument("--warmup", type=float, default=None,
                   help=f"seconds of load first whose requests are recorded but left out of the statistics "
                        f"(default {defaults['warmup']:g}; a trace: 0); with --interval the longest a point waits "
                        f"for its load to steady once its first users' requests are all done, at most 3x it before "
                        f"(a capacity search: {defaults['search_warmup']:g})")
    g.add_argument("--interval", type=float, default=None, metavar="PCT",
                   help=f"a point starts measuring once its load is steady and ends once the 95%% interval of its "
                        f"output tokens/s is within ±PCT%% of it, or at --warmup/--duration (default: "
                        f"{defaults['search_interval']:g} in a capacity search, else off; 0: off, a fixed --warmup "
                        f"and --duration)")
    g.add_argument("--max-users", type=int, default=None,
                   help=f"capacity search: the most users it may try (default {DEFAULT_MAX_USERS}; diagnose: at most "
                        f"{SEATS_MULTIPLE}x --max-num-seqs, past which extra users only wait in the engine's queue)")
    g.add_argument("--workload", default=defaults["workload"],
                   help=f"one of {', '.join(sorted(WORKLOADS))}, or trace:FILE to replay a Mooncake JSONL, "
                        f"BurstGPT CSV or Azure LLM inference CSV trace (bundled: {', '.join(SAMPLES)}) "
                        f"(default %(default)s)")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="trace replay: multiply the trace's gaps by X (2: half speed, 0.5: double) (default 1)")
    g.add_argument("--max-requests", type=int, default=None, help="trace replay: send the first N requests only")
    g.add_argument("--max-tokens", type=int, default=defaults["max_tokens"],
                   help="cap on output tokens per request (default: the workload's own)")
    g.add_argument("--processes", type=int, default=1,
                   help="Locust worker processes (more than 1: Locust's master/worker mode, stats merged)")
    if with_seed:
        g.add_argument("--seed", type=int, default=0, help="seeds the workload and the arrivals")
    g.add_argument("--sweep", default=None, help="several points into one directory: users=1,4,16 or rate=0.5,1,2")
    g.add_argument("--slo", default=None, help="goodput: the share of requests within ttft=S,tpot=S,e2e=S seconds")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="open loop: gamma shape of the gaps (1 is Poisson; below 1 burstier)")
    g.add_argument("--burst-size", type=int, default=None,
                   help="open loop: requests per arrival (default 8 for the burst workload, else 1)")
    g.add_argument("--api", choices=APIS, default=None,
                   help="endpoint to load (default completions; chat for chat-sessions)")
    g.add_argument("--turns", type=int, default=4,
                   help="chat-sessions: user turns per session, each sending the whole history (default 4)")
    g.add_argument("--no-ignore-eos", action="store_true",
                   help="let the model stop early (by default each request asks for exactly its max_tokens)")
    g.add_argument("--stop-timeout", type=float, default=120.0,
                   help="seconds in-flight requests get to finish after the duration (default %(default)s)")
    g.add_argument("--out", type=Path, default=None, help="run directory to write (must be new or empty)")


def is_search(args: argparse.Namespace) -> bool:
    """Whether the command searches for the server's capacity: no --users, --rate, --sweep, trace, --ablate or
    --master (each of those runs one load point, or points of its own). ``diagnose --retest`` without them searches
    first, then reruns the verdict's point with the lever pulled."""
    return (args.users is None and args.rate is None and args.sweep is None and not is_trace(args.workload)
            and not getattr(args, "ablate", False) and not getattr(args, "master", False))


def add_master_args(parser: argparse.ArgumentParser) -> None:
    """``load``'s flags for a load spread over machines (workers: ``servescope worker``)."""
    g = parser.add_argument_group("load from many machines")
    g.add_argument("--master", action="store_true",
                   help="run only Locust's master here and send the load from `servescope worker` processes, "
                        "on this machine or others; the run directory is written here as usual")
    g.add_argument("--expect-workers", type=int, default=None,
                   help="with --master: how many workers to wait for before the load starts")
    g.add_argument("--master-bind-host", default=DEFAULT_MASTER_BIND_HOST,
                   help="with --master: the interface workers connect to (default %(default)s: all)")
    g.add_argument("--master-bind-port", type=int, default=DEFAULT_MASTER_PORT,
                   help="with --master: the TCP port workers connect to (default %(default)s)")
    g.add_argument("--worker-wait", type=float, default=DEFAULT_WORKER_WAIT_S,
                   help="with --master: seconds to wait for every worker to join before giving up (default %(default)g)")


def with_master(configs: list[LoadConfig], args: argparse.Namespace) -> list[LoadConfig]:
    """The configs as ``--master``/``--expect-workers`` change them (unchanged without --master)."""
    if not args.master:
        if args.expect_workers is not None:
            raise ValueError("--expect-workers needs --master")
        return configs
    if args.expect_workers is None:
        raise ValueError("--master needs --expect-workers N: how many `servescope worker` processes will join")
    if args.expect_workers < 1:
        raise ValueError(f"--expect-workers must be >= 1, got {args.expect_workers}")
    if args.processes != 1:
        raise ValueError("--processes forks workers on this machine; with --master they join as "
                         "`servescope worker`: drop --processes")
    if len(configs) > 1:
        # NOTE: each point is a Locust run of its own, and Locust's workers leave when their master quits.
        raise ValueError("--master runs one load point (its workers leave when it ends): drop --sweep, and run "
                         "one `servescope load --master` per point")
    master = MasterConfig(args.master_bind_host, args.master_bind_port, args.worker_wait)
    return [dataclasses.replace(c, processes=args.expect_workers, master=master) for c in configs]


def configs_from_args(args: argparse.Namespace, defaults: dict[str, Any]) -> tuple[list[LoadConfig], Any]:
    """The load config of every point, and the sweep (``None`` for a single point).

    For a capacity search (:func:`is_search`) one config, at 1 user, whose users the search replaces.
    """
    users, rate = args.users, args.rate
    sweep = parse_sweep(args.sweep) if args.sweep else None
    trace = is_trace(args.workload)
    duration, warmup, interval = args.duration, args.warmup, args.interval
    if is_search(args):
        users = 1
        duration = defaults["search_duration"] if duration is None else duration
        warmup = defaults["search_warmup"] if warmup is None else warmup
        interval = defaults["search_interval"] if interval is None else interval
    if trace:
        if sweep is not None:
            raise ValueError("a trace replays its own arrivals: drop --sweep")
        if duration is None:
            requests = read_trace(trace_path(args.workload), args.time_scale, args.max_requests)
            duration = requests[-1].arrival_s + TRACE_TAIL_S
        warmup = 0.0 if warmup is None else warmup
    duration = defaults["duration"] if duration is None else duration
    warmup = defaults["warmup"] if warmup is None else warmup
    if not trace and users is None and rate is None:
        if sweep is not None and sweep[0] == "rate":
            rate = sweep[1][0]
        else:
            users = defaults["users"]
    base = LoadConfig(
        users=users, rate=rate, duration_s=duration, warmup_s=warmup, workload=args.workload,
        seed=args.seed, processes=args.processes, max_tokens=args.max_tokens, burstiness=args.burstiness,
        burst_size=args.burst_size, ignore_eos=not args.no_ignore_eos, turns=args.turns,
        api=args.api or ("chat" if args.workload == "chat-sessions" else "completions"),
        slo=parse_slo(args.slo) if args.slo else {}, stop_timeout_s=args.stop_timeout,
        time_scale=args.time_scale, max_requests=args.max_requests,
        stop_rule=StopRule(interval / 100) if interval else None,
    )
    if sweep is None:
        return [base], None
    return [base.at_point(sweep[0], value) for value in sweep[1]], sweep


def schedule_words(config: LoadConfig) -> str:
    """How long each point runs, in words."""
    if config.stop_rule is None:
        return f"{config.warmup_s:g} s warm-up + {config.duration_s:g} s per point"
    return (f"each point measured once steady (warm-up at most {config.warmup_s:g} s) until its output tok/s is "
            f"known within ±{config.stop_rule.target:.0%} (95%), at most {config.duration_s:g} s")


def diagnose_max_users(args: argparse.Namespace) -> int:
    """The most users ``diagnose``'s search tries: ``--max-users``, else up to ``SEATS_MULTIPLE`` times the
    engine's seats (past them extra users only queue, which the point at that many already shows)."""
    if args.max_users is not None:
        return int(args.max_users)
    return min(DEFAULT_MAX_USERS, SEATS_MULTIPLE * int(args.max_num_seqs))
