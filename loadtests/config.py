"""One load run's settings (``LoadConfig``), the sweep and SLO flag syntax, and their validation."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests.workloads.catalog import check_workload_name, is_trace

APIS = ("completions", "chat")
# Per-request latencies an SLO can bound, in seconds (see reports.measures.goodput).
SLO_METRICS = ("ttft", "tpot", "e2e")
SWEEP_PARAMETERS = ("users", "rate")
# Requests per arrival when the ``burst`` workload runs open loop and no --burst-size is given.
DEFAULT_BURST_SIZE = 8
# The most closed-loop users a capacity search (loadtests.capacity) tries unless told otherwise.
DEFAULT_MAX_USERS = 64
# Where a Locust master listens for its workers by default (Locust's own port, every interface).
DEFAULT_MASTER_BIND_HOST = "*"
DEFAULT_MASTER_PORT = 5557
# What every Locust process of a run loads (a master, its workers, a lone runner), as users run it with plain Locust.
LOCUSTFILE = Path(__file__).with_name("locustfile.py")
# Seconds a master waits for its --expect-workers to join before it gives up.
DEFAULT_WORKER_WAIT_S = 300.0


@dataclass(slots=True, frozen=True)
class MasterConfig:
    """A run whose Locust workers join from elsewhere (``servescope worker``): where the master listens,
    and how long it waits for all of them (``LoadConfig.processes``) before it gives up."""

    bind_host: str = DEFAULT_MASTER_BIND_HOST
    bind_port: int = DEFAULT_MASTER_PORT
    wait_s: float = DEFAULT_WORKER_WAIT_S

    def __post_init__(self) -> None:
        if not 1 <= self.bind_port <= 65535:
            raise ValueError(f"master bind port must be in 1..65535, got {self.bind_port}")
        if not (self.wait_s > 0 and math.isfinite(self.wait_s)):
            raise ValueError(f"the wait for workers must be a positive number of seconds, got {self.wait_s}")


# Seconds past its caps (warm-up + duration) a controlled point's users go on when no stop came (a lost
# orchestrator); the orchestrator itself stops every point within its caps.
CONTROL_SLACK_S = 10.0
# How many warm-up caps a controlled closed loop waits at most for its first cohort to be replaced
# (:mod:`loadtests.point_stop`); its users' deadline leaves room for it.
COHORT_WAIT_FACTOR = 3.0


def longest_warmup_s(warmup_s: float, is_controlled: bool, is_closed_loop: bool) -> float:
    """The longest a point may warm up: a controlled closed loop waits for its first cohort past its cap."""
    return warmup_s * (COHORT_WAIT_FACTOR if is_controlled and is_closed_loop else 1.0)


@dataclass(slots=True, frozen=True)
class StopRule:
    """A point that ends once its throughput is known well enough (:mod:`loadtests.point_stop`): when the 95%
    interval of its output tokens/s is within ``target`` of the value (0.05: within ±5%). It starts measuring
    once its load is steady; ``LoadConfig.warmup_s`` and ``duration_s`` are then caps, not lengths."""

    target: float = 0.05

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError(f"the interval target must be a share between 0 and 1 (0.05: ±5%), got {self.target}")


@dataclass(slots=True)
class LoadConfig:
    """What load to offer: the arrival process, the workload, how long, and what counts as good.

    Exactly one of ``users`` (closed loop: N users, each sends its next request when the last one
    ends) or ``rate`` (open loop: arrivals at ``rate`` requests/s whatever the server does), or
    neither for a ``trace:FILE`` workload, whose requests go out at the trace's own times (gaps times
    ``time_scale``; the first ``max_requests`` of them when set).
    Requests sent in the first ``warmup_s`` seconds are recorded but flagged and left out of
    every statistic. ``burstiness`` is the gamma shape of the open loop's gaps (1: Poisson, < 1:
    burstier); ``burst_size`` requests arrive together at each arrival.
    """

    users: int | None = None
    rate: float | None = None
    duration_s: float = 60.0
    warmup_s: float = 10.0
    workload: str = "sharegpt-synth"
    seed: int = 0
    processes: int = 1  # Locust worker processes: forked here, or (``master``) joining from anywhere
    max_tokens: int | None = None
    burstiness: float = 1.0
    burst_size: int | None = None  # None: DEFAULT_BURST_SIZE for the burst workload, else 1
    api: str = "completions"
    ignore_eos: bool = True
    slo: dict[str, float] = field(default_factory=dict)
    stop_timeout_s: float = 120.0  # how long in-flight requests get to finish after the duration
    num_plan_items: int | None = None  # None: sized from the load (see plan_size)
    time_scale: float = 1.0  # trace replay: multiplies the trace's gaps (2: half speed)
    max_requests: int | None = None  # trace replay: the first N requests of the trace
    turns: int = 4  # chat-sessions: user turns per session
    token_scale: float = 1.0  # multiplies each request's prompt and output tokens (capacity's tokens experiment)
    master: MasterConfig | None = None  # None: Locust's workers run here (--processes)
    stop_rule: StopRule | None = None  # None: a fixed warm-up and duration

    def __post_init__(self) -> None:
        check_workload_name(self.workload)
        if isinstance(self.master, dict):  # read back from load.json
            self.master = MasterConfig(**self.master)
        if isinstance(self.stop_rule, dict):
            self.stop_rule = StopRule(**self.stop_rule)
        if self.stop_rule is not None and self.is_trace:
            raise ValueError("a trace replays its own arrivals to the end: it takes no stopping rule (--interval)")
        if self.is_trace:
            if self.users is not None or self.rate is not None:
                raise ValueError("a trace sets its own arrival times: drop --users/--rate (use --time-scale)")
            if not self.time_scale > 0:
                raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
            if self.max_requests is not None and self.max_requests < 1:
                raise ValueError(f"max_requests must be >= 1, got {self.max_requests}")
            if self.processes != 1:
                raise ValueError("trace replay runs in one worker process, which keeps the trace's order")
        elif self.time_scale != 1.0 or self.max_requests is not None:
            raise ValueError("--time-scale and --max-requests apply to trace:FILE workloads only")
        elif (self.users is None) == (self.rate is None):
            raise ValueError("give exactly one of users (closed loop) or rate (open loop)")
        if self.users is not None and self.users < 1:
            raise ValueError(f"users must be >= 1, got {self.users}")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a positive number of requests/s, got {self.rate}")
        if not self.duration_s > 0:
            raise ValueError(f"duration must be > 0 seconds, got {self.duration_s}")
        if not self.warmup_s >= 0:
            raise ValueError(f"warmup must be >= 0 seconds, got {self.warmup_s}")
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes}")
        if self.users is not None and self.users < self.processes:
            raise ValueError(f"{self.users} users cannot keep {self.processes} worker processes busy; "
                             f"use at least as many users as {'workers' if self.master else 'processes'}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0 (1 is Poisson), got {self.burstiness}")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {self.api!r}")
        if self.workload == "chat-sessions":
            if self.api != "chat":
                raise ValueError("chat-sessions sends a conversation's history as messages: use --api chat")
            if self.users is None:
                raise ValueError("chat-sessions is a closed loop (each user waits for its reply): give --users")
        if not self.token_scale > 0:
            raise ValueError(f"token_scale must be > 0, got {self.token_scale}")
        if self.token_scale != 1.0 and (self.is_trace or self.workload in ("shared-prefix", "chat-sessions")):
            raise ValueError(f"the {self.workload} workload sets its own lengths; token_scale needs one that "
                             f"draws them (sharegpt-synth, fixed, mixed, long-context, burst)")
        if self.turns < 1:
            raise ValueError(f"turns must be >= 1, got {self.turns}")
        unknown = sorted(set(self.slo) - set(SLO_METRICS))
        if unknown:
            raise ValueError(f"unknown SLO metrics {unknown}; known: {', '.join(SLO_METRICS)}")
        if any(not value > 0 for value in self.slo.values()):
            raise ValueError(f"SLO bounds must be > 0 seconds, got {self.slo}")
        if not self.stop_timeout_s > 0:
            raise ValueError(f"stop_timeout must be > 0 seconds, got {self.stop_timeout_s}")
        if self.num_plan_items is not None and self.num_plan_items < 1:
            raise ValueError(f"num_plan_items must be >= 1, got {self.num_plan_items}")
        if self.users is not None:
            if self.workload == "burst":
                raise ValueError("the burst workload sends groups of requests at once: give --rate, not --users")
            if self.burst_size not in (None, 1):
                raise ValueError("--burst-size needs an open loop (--rate); closed-loop users send one at a time")
            if self.burstiness != 1.0:
                raise ValueError("--burstiness shapes open-loop gaps (--rate); closed-loop users have none")
        if self.burst_size is None:
            self.burst_size = DEFAULT_BURST_SIZE if self.workload == "burst" and self.rate is not None else 1
        if self.burst_size < 1:
            raise ValueError(f"burst_size must be >= 1, got {self.burst_size}")

    @property
    def has_workers(self) -> bool:
        """Whether Locust runs a master and workers (the client rows travel to the master), not one process."""
        return self.processes > 1 or self.master is not None

    @property
    def is_open_loop(self) -> bool:
        return self.rate is not None

    @property
    def is_trace(self) -> bool:
        return is_trace(self.workload)

    @property
    def point_name(self) -> str:
        """``users-8`` or ``rate-2.5``: the name of this load point (a sweep's subdirectory)."""
        if self.is_trace:
            return "trace"
        return f"users-{self.users}" if self.users is not None else f"rate-{self.rate:g}"

    @property
    def run_time_s(self) -> float:
        """The longest the load sends: warm-up + duration, and a controlled point's slack past its caps."""
        controlled = self.stop_rule is not None
        return (longest_warmup_s(self.warmup_s, controlled, self.users is not None) + self.duration_s
                + (CONTROL_SLACK_S if controlled else 0.0))

    def plan_size(self) -> int:
        """How many distinct requests to prepare; workers cycle through them if they send more.

        NOTE: only a bound on memory and file size; it never limits how many requests go out.
        """
        if self.num_plan_items is not None:
            return self.num_plan_items
        if self.is_trace:
            return self.max_requests or 1  # NOTE: unused: a trace plan holds the whole (cut) trace
        if self.rate is not None:
            expected = self.rate * self.run_time_s * 1.5 + 16
        else:
            expected = (self.users or 1) * self.run_time_s * 4
        return int(min(max(expected, 256), 4096))

    def at_point(self, parameter: str, value: float) -> LoadConfig:
        """This config at one sweep point: ``users`` or ``rate`` set to ``value``, the other cleared."""
        if parameter == "users":
            if value != int(value):
                raise ValueError(f"users must be whole numbers, got {value}")
            return dataclasses.replace(self, users=int(value), rate=None)
        if parameter == "rate":
            return dataclasses.replace(self, rate=float(value), users=None)
        raise ValueError(f"cannot sweep {parameter!r}; sweepable: {', '.join(SWEEP_PARAMETERS)}")

    def to_dict(self) -> dict[str, Any]:
        mode = "trace" if self.is_trace else "open" if self.is_open_loop else "closed"
        return {**dataclasses.asdict(self), "mode": mode,
                "point": self.point_name}


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """``"users=1,4,16"`` -> ``("users", [1.0, 4.0, 16.0])``."""
    parameter, sep, values_text = text.partition("=")
    parameter = parameter.strip()
    if not sep or parameter not in SWEEP_PARAMETERS:
        raise ValueError(f"--sweep must look like users=1,4,16 or rate=0.5,1,2; got {text!r}")
    try:
        values = [float(v) for v in values_text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--sweep {text!r}: the values must be numbers") from None
    if not values:
        raise ValueError(f"--sweep {text!r} lists no values")
    if len(set(values)) != len(values):
        raise ValueError(f"--sweep {text!r} repeats a value")
    return parameter, values


def parse_slo(text: str) -> dict[str, float]:
    """``"ttft=0.5,tpot=0.05"`` -> ``{"ttft": 0.5, "tpot": 0.05}`` (seconds)."""
    slo: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"--slo must look like ttft=0.5,tpot=0.05 (seconds); got {text!r}")
        try:
            slo[name.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--slo {part!r}: {value!r} is not a number of seconds") from None
    return slo
