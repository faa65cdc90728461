"""What each lever would buy at this load, predicted before anyone pays for a run.

The run's own steps fit a step-time model (:mod:`reports.levers.step_model`); its measured requests are
replayed through the engine's scheduler on a simulated clock (:mod:`probes.replay`), once with the
run's own settings and once per lever pulled. A lever's predicted gain is the ratio of the two
replays' output throughput, so a bias the replay has on this run cancels out; the replay of the
run's own settings is checked against what was measured and that error is shown beside the gains.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from probes.replay import (
    EngineConfig,
    ReplayLoad,
    ReplayMeasures,
    SimRequest,
    SimStep,
    engine_config,
    pseudo_token_ids,
    replay,
)
from probes.run_dir import CALIBRATION_NAME, PLAN_NAME, RunDirectory
from probes.step_calibration import StepCalibration
from reports.dataset import RunDataset
from reports.levers.step_model import StepModel, fit_step_model

# A lever predicted to gain less than this (as a ratio of output throughput) is not worth pulling.
WORTH_PULLING = 1.10
# The most sequences the seat lever proposes; past this the KV pool, not the cap, is the question.
MAX_SEATS = 256


@dataclass(slots=True)
class LeverPrediction:
    """One lever: the flags that pull it, and what it is predicted (and, after a retest, measured) to give."""

    lever: str
    flags: str
    description: str
    predicted_gain: float | None  # output throughput, replay with the lever over replay without
    predicted: dict[str, Any] | None = None  # predicted output_throughput, ttft_p50, tpot_p50 at this load
    measured_gain: float | None = None
    measured: dict[str, Any] | None = None
    note: str = ""
    add_flags: list[str] = field(default_factory=list)  # serve flags that pull it (the bundled engine)
    drop_flags: list[str] = field(default_factory=list)  # serve flags (with their values) it removes
    users: int | None = None  # the load lever: the closed-loop users to offer instead

    @property
    def is_worth_pulling(self) -> bool:
        return self.predicted_gain is not None and self.predicted_gain >= WORTH_PULLING

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "worth_pulling": self.is_worth_pulling}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeverPrediction:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(slots=True)
class Predictions:
    """Every lever's prediction for one load point, best first, with the model and replay they rest on."""

    levers: list[LeverPrediction] = field(default_factory=list)
    step_model: dict[str, Any] | None = None
    replay_check: dict[str, Any] | None = None  # the replay of the run's own settings vs what was measured
    unknown: str | None = None  # why nothing could be predicted

    @property
    def best(self) -> LeverPrediction | None:
        worth = [lever for lever in self.levers if lever.is_worth_pulling]
        return max(worth, key=lambda lever: lever.predicted_gain or 0.0) if worth else None

    def verdict(self) -> str:
        best = self.best
        if self.unknown is not None:
            return f"gains not predicted: {self.unknown}"
        if best is not None:
            return (f"pull {best.flags} ({best.description}): predicted {best.predicted_gain:.2f}x output "
                    f"throughput at this load")
        if not self.levers:
            return "no lever applies to this configuration"
        return (f"no lever is predicted to gain {WORTH_PULLING - 1:.0%} at this load (best "
                f"{max(self.levers, key=lambda lv: lv.predicted_gain or 0.0).flags}): the hardware is saturated "
                f"at this load")

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"step_model": self.step_model, "replay_check": self.replay_check, "unknown": self.unknown,
                "best": best.lever if best else None, "best_flags": best.flags if best else None,
                "verdict": self.verdict()}


@dataclass(frozen=True, slots=True)
class Lever:
    """A change to try: engine config changes, a step-cost change, or a load change (``users``)."""

    lever: str
    flags: str
    description: str
    changes: Mapping[str, Any] = field(default_factory=dict)
    is_measured: bool = True  # False: what it changes was never measured (the other path uncalibrated), nothing predicted
    users: int | None = None
    note: str = ""
    drop_flags: tuple[str, ...] = ()

    @property
    def add_flags(self) -> list[str]:
        return self.flags.split() if self.flags.startswith("--") and self.users is None else []


def candidate_levers(config: Mapping[str, Any], load: ReplayLoad, calibration: StepCalibration | None,
                     offer_load: bool = False) -> list[Lever]:
    """The levers that apply to a run of the bundled engine with ``config`` under ``load``; with
    ``offer_load`` (the verdict found the load, not the server, to be the limit) more load is one."""
    out: list[Lever] = []
    seats = int(config["max_num_seqs"])
    new_seats = min(max(2 * seats, load.users or 0), MAX_SEATS)
    if new_seats > seats:
        out.append(Lever("max_num_seqs", f"--max-num-seqs {new_seats}", "more sequences per batch",
                         {"max_num_seqs": new_seats}))
    budget = int(config["max_num_batched_tokens"])
    out.append(Lever("max_num_batched_tokens", f"--max-num-batched-tokens {2 * budget}", "a bigger token budget per step",
                     {"max_num_batched_tokens": 2 * budget}))
    if config.get("kv_layout") == "contiguous":
        out.append(Lever("kv_layout", "--kv-layout paged", "paged KV blocks instead of max-length reservations",
                         {"kv_layout": "paged"}))
    blocks = int(config["num_kv_blocks"])
    out.append(Lever("kv_pool", f"--num-kv-blocks {2 * blocks}", "twice the KV pool", {"num_kv_blocks": 2 * blocks},
                     drop_flags=("--kv-cache-mb", "--num-kv-blocks")))
    if not config.get("enable_prefix_caching", True):
        out.append(Lever("prefix_caching", "(drop --no-prefix-caching)", "prefix caching on",
                         {"enable_prefix_caching": True}, drop_flags=("--no-prefix-caching",)))
    if config.get("execution") == "eager":
        out.append(Lever("execution", "--execution optimized", "the optimized execution path",
                         {"execution": "optimized"}, is_measured=is_calibrated(calibration, "optimized"),
                         note=calibration_note(calibration, "optimized")))
    if float(config.get("host_overhead_ms") or 0.0) > 0:
        out.append(Lever("host_overhead", "--host-overhead-ms 0", "no per-step host overhead",
                         {"host_overhead_ms": 0.0}))
    if offer_load and load.users is not None:
        out.append(Lever("load", f"--users {2 * load.users}", "twice the offered load (more users)",
                         users=2 * load.users))
    return out


def is_calibrated(calibration: StepCalibration | None, path: str) -> bool:
    return calibration is not None and path in calibration.forward_s


def calibration_note(calibration: StepCalibration | None, path: str) -> str:
    """How the other execution path's step was measured, or why its gain is not predicted."""
    if calibration is None or path not in calibration.forward_s:
        return ("not predicted: the step calibration did not time this path for this run "
                f"(no {CALIBRATION_NAME}; `servescope diagnose` writes it before the load)")
    at = calibration.batches[-1]
    return (f"{path} forward calibrated before the load at batch sizes {', '.join(map(str, calibration.batches))} "
            f"({calibration.forward(calibration.run_path, at) * 1000:.1f} -> {calibration.forward(path, at) * 1000:.1f} "
            f"ms at {at}); a step saves those milliseconds, the rest of the loaded step stays")


def replay_inputs(data: RunDataset) -> tuple[list[SimRequest], ReplayLoad] | str:
    """The run's requests and load as the replay takes them, or why they cannot be had.

    Times count from the run's first send; the measured part starts at its first measured send.
    """
    client = data.client
    if client is None or not len(client):
        return "the run has no client rows to replay"
    info = data.load_info
    config = info.config if info is not None else {}
    rows = client[client["is_ok"]].sort_values("send_time")
    if rows.empty:
        return "no request succeeded"
    start = float(client["send_time"].min())
    users = config.get("users") if config.get("mode", "closed") == "closed" else None
    plan = read_plan_items(data.path / PLAN_NAME)
    if users is not None and plan:
        # NOTE: closed-loop users take the plan's requests in order, so a faster replay sends the plan's
        # next requests (never repeats of the sent ones, which would hit the prefix cache).
        sent = {int(i): (n, o) for i, n, o in zip(rows["plan_index"], rows["num_prompt_tokens"],
                                                   rows["num_output_tokens"], strict=True) if pd.notna(i)}
        items = [(item["prompt"], *sent.get(int(item["index"]), (item["num_prompt_tokens"], item["max_tokens"])))
                 for item in plan]
        texts = [text for text, _, _ in items]
        prompt_counts = [max(1, int(n)) if pd.notna(n) else 1 for _, n, _ in items]
        outputs = [max(1, int(o)) if pd.notna(o) else 1 for _, _, o in items]
        ids = pseudo_token_ids(texts, prompt_counts)
        requests = [SimRequest(t, n) for t, n in zip(ids, outputs, strict=True)]
    else:
        prompt_counts = list(rows["num_prompt_tokens"].fillna(rows["planned_prompt_tokens"]).fillna(1).astype(int)
                             .clip(lower=1))
        texts = [data.prompts.get(int(i), f"request-{n}") if pd.notna(i) else f"request-{n}"
                 for n, i in enumerate(rows["plan_index"])]
        ids = pseudo_token_ids(texts, prompt_counts)
        outputs = list(rows["num_output_tokens"].fillna(1).astype(int).clip(lower=1))
        requests = [SimRequest(t, int(n), float(s) - start)
                    for t, n, s in zip(ids, outputs, rows["send_time"], strict=True)]
    measured = client[~client["is_warmup"]]
    warmup = float(measured["send_time"].min()) - start if len(measured) else float(config.get("warmup_s", 0.0))
    duration = float(config.get("duration_s", 0.0)) or float(rows["send_time"].max() - start - warmup)
    gap = closed_loop_gap_s(rows, int(users)) if users else client_gap_s(data)
    return requests, ReplayLoad(users=int(users) if users else None, warmup_s=warmup, duration_s=duration,
                                gap_s=gap)


def closed_loop_gap_s(rows: pd.DataFrame, users: int) -> float:
    """A closed-loop user's time between one response's end and its next send (think time, client work):
    by Little's law each user cycles through E2E + gap, so gap = users / send rate - mean E2E (over the
    sends, which all users take part in; the drain after the last send would bias the rate)."""
    span = float(rows["send_time"].max() - rows["send_time"].min())
    if span <= 0 or len(rows) < 2:
        return 0.0
    return max(users * span / (len(rows) - 1) - float(rows["e2e_s"].mean()), 0.0)


def read_plan_items(path: Path) -> list[dict[str, Any]]:
    """The run's request plan (``workload.jsonl``) in plan order; empty when the run has none."""
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as f:
        items = [json.loads(line) for line in f if line.strip()]
    return sorted(items, key=lambda item: int(item["index"]))


def client_gap_s(data: RunDataset) -> float:
    """The client's own time per request (send to engine arrival, engine finish to the client's end), median."""
    requests, client = data.frame("requests"), data.client
    if client is None or not len(requests) or "request_id" not in client:
        return 0.0
    joined = client.merge(requests, on="request_id", suffixes=("", "_engine"))
    gap = (joined["arrival_time"] - joined["send_time"]) + (joined["end_time"] - joined["finish_time"])
    gap = gap.dropna()
    return max(float(gap.median()), 0.0) if len(gap) else 0.0


def predict_levers(data: RunDataset, offer_load: bool = False) -> Predictions:
    """Fit the step model on ``data``'s steps, replay its load, and predict every lever that applies."""
    if not data.has_engine_probes:
        return Predictions(unknown="the run has no engine steps to fit a step-time model on (an external server)")
    calibration = RunDirectory(data.path).load(CALIBRATION_NAME, StepCalibration)
    model = fit_step_model(data.steps_in_window(), calibration=calibration)
    if model is None:
        return Predictions(unknown="too few busy engine steps to fit a step-time model")
    inputs = replay_inputs(data)
    if isinstance(inputs, str):
        return Predictions(step_model=model.to_dict(), unknown=inputs)
    requests, load = inputs
    recorded = data.engine_config
    try:
        base_config = engine_config(recorded)
    except (ValueError, TypeError) as exc:
        return Predictions(step_model=model.to_dict(), unknown=f"the run's engine config cannot be replayed: {exc}")
    base = replay(base_config, requests, load, step_cost(model, base_config, base_config))
    measured = _measured(data, load)
    check = {"replayed": base.to_dict(), "measured": measured,
             "throughput_error": _error(base.steady_throughput, measured.get("steady_output_throughput"))}
    levers = []
    for lever in candidate_levers(recorded, load, calibration, offer_load):
        levers.append(_predict_one(lever, recorded, requests, load, model, base, measured))
    levers.sort(key=lambda lv: -(lv.predicted_gain or 0.0))
    return Predictions(levers=levers, step_model=model.to_dict(), replay_check=check)


def step_cost(model: StepModel, config: EngineConfig, recorded: EngineConfig) -> Callable[[SimStep], float]:
    """The fitted step time on ``config`` (its execution path included); burnt host time as the run measured it
    when the knob is unchanged."""
    if recorded.host_overhead_ms > 0:
        host_s = model.host_overhead_s * config.host_overhead_ms / recorded.host_overhead_ms
    else:
        host_s = config.host_overhead_ms / 1000
    path = config.execution if config.execution != recorded.execution else None

    def cost(step: SimStep) -> float:
        return model.step_time(step, host_s, path)

    return cost


def _predict_one(lever: Lever, recorded: Mapping[str, Any], requests: list[SimRequest], load: ReplayLoad,
                 model: StepModel, base: ReplayMeasures, measured: Mapping[str, Any]) -> LeverPrediction:
    pulls = {"add_flags": lever.add_flags, "drop_flags": list(lever.drop_flags), "users": lever.users}
    if not lever.is_measured:
        return LeverPrediction(lever.lever, lever.flags, lever.description, None, note=lever.note, **pulls)
    config = engine_config(recorded, lever.changes)
    lever_load = dataclasses.replace(load, users=lever.users) if lever.users is not None else load
    result = replay(config, requests, lever_load, step_cost(model, config, engine_config(recorded)))
    gain = _ratio(result.steady_throughput, base.steady_throughput)

    def scaled(key: str, predicted: float | None, replayed: float | None) -> float | None:
        """The measured figure times the replays' ratio (falls back to the replay's own figure)."""
        ratio = _ratio(predicted, replayed)
        return measured[key] * ratio if ratio is not None and measured.get(key) is not None else predicted

    predicted = {"output_throughput": scaled("output_throughput", result.steady_throughput, base.steady_throughput),
                 "ttft_p50": scaled("ttft_p50", result.ttft_p50, base.ttft_p50),
                 "tpot_p50": scaled("tpot_p50", result.tpot_p50, base.tpot_p50),
                 "replayed": result.to_dict()}
    return LeverPrediction(lever.lever, lever.flags, lever.description, gain, predicted, note=lever.note, **pulls)


def _measured(data: RunDataset, load: ReplayLoad) -> dict[str, Any]:
    """The run's own figures: as its report shows them, and its output tokens per second while it was
    sending (from the first measured send for the load's duration), the replay's steady throughput.

    NOTE: the steady rate counts the engine's own token times: a stream's chunk may carry several tokens.
    """
    lat, client = data.latencies, data.client
    ok = lat[lat["is_ok"]] if len(lat) else lat
    window = data.window[1] - data.window[0]
    if not len(ok) or not window > 0 or client is None:
        return {}
    start = float(client["send_time"].min()) + load.warmup_s
    times = [t for row in data.frame("requests")["token_times"] if row is not None for t in row]
    steady = sum(1 for t in times if start < t <= start + load.duration_s) / load.duration_s
    return {"output_throughput": float(ok["num_output_tokens"].sum()) / window, "steady_output_throughput": steady,
            "ttft_p50": float(ok["ttft_s"].median()), "tpot_p50": float(ok["tpot_s"].median())}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _error(predicted: float | None, measured: float | None) -> float | None:
    return (predicted - measured) / measured if predicted is not None and measured else None

