"""What each lever would buy at this load, predicted before anyone pays for a run.

The run's own steps fit a step-time model (:mod:`reports.levers.step_model`); its measured requests are
replayed through the engine's scheduler on a simulated clock (:mod:`probes.replay`), once with the
run's own settings and once per lever pulled. A lever's predicted gain is the ratio of the two
replays' output throughput, so a bias the replay has on this run cancels out; the replay of the
run's own settings is checked against what was measured and that error is shown beside the gains.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from probes.accuracy import LeverAccuracy
from probes.replay import (
    EngineConfig,
    ReplayLoad,
    ReplayMeasures,
    SimRequest,
    SimStep,
    engine_config,
    replay,
)
from probes.run_dir import CALIBRATION_NAME, RunDirectory
from probes.step_calibration import StepCalibration
from reports.dataset import RunDataset
from reports.levers.execution import execution_lever_specs
from reports.levers.replay_inputs import load_window, measured_figures, replay_inputs
from reports.levers.saturation import ENGINE_BUSY, FAR_FROM_ROOF
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
    changes_numbers: bool = False  # it changes the numbers the model computes (a dtype, quantized weights)
    accuracy: dict[str, Any] | None = None  # probes.accuracy.LeverAccuracy, for a lever that changes the numbers

    @property
    def is_worth_pulling(self) -> bool:
        return self.predicted_gain is not None and self.predicted_gain >= WORTH_PULLING

    @property
    def price(self) -> str:
        """What the lever costs in accuracy, in words."""
        if not self.changes_numbers:
            return "none: the model computes the same numbers"
        if self.accuracy is None:
            return "not measured"
        return LeverAccuracy.from_dict(self.accuracy).describe()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "worth_pulling": self.is_worth_pulling, "price": self.price}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LeverPrediction:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(slots=True)
class Predictions:
    """Every lever's prediction for one load point, best first, with the model and replay they rest on.

    ``busy_fraction`` and ``roof_share`` are the device's own evidence (the engine's busy share of the window,
    its decode step's roofline floor over the step), set by whoever attaches the predictions to a verdict:
    "the hardware is saturated" is said only when every lever was predicted, none gains, and they agree.
    """

    levers: list[LeverPrediction] = field(default_factory=list)
    step_model: dict[str, Any] | None = None
    replay_check: dict[str, Any] | None = None  # the replay of the run's own settings vs what was measured
    unknown: str | None = None  # why nothing could be predicted
    busy_fraction: float | None = None
    roof_share: float | None = None
    calibration: dict[str, Any] | None = None  # what the step calibration timed and what it cost this run

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
                    f"throughput at this load; accuracy cost: {best.price}")
        if not self.levers:
            return "no lever applies to this configuration"
        predicted = [lv for lv in self.levers if lv.predicted_gain is not None]
        missing = [lv for lv in self.levers if lv.predicted_gain is None]
        if predicted:
            top = max(predicted, key=lambda lv: lv.predicted_gain or 0.0)
            head = (f"no lever is predicted to gain {WORTH_PULLING - 1:.0%} at this load (best {top.flags}, "
                    f"{top.predicted_gain:.2f}x)")
        else:
            head = "no lever's gain could be predicted"
        if missing:
            why = "; ".join(f"{lv.flags} ({lv.note or 'no figure'})" for lv in missing)
            return f"{head}; not predicted: {why}; so whether the hardware is saturated is not known"
        busy, roof = self.busy_fraction, self.roof_share
        if busy is None or busy < ENGINE_BUSY:
            busy_text = "not measured" if busy is None else f"{busy:.0%}"
            return (f"{head}; the engine was stepping {busy_text} of the window, so the offered load, not the "
                    f"hardware, is what is left to raise")
        if roof is not None and roof < FAR_FROM_ROOF:
            return (f"{head}; the engine was busy {busy:.0%} of the window but its decode step spent {roof:.0%} of "
                    f"its time at its roofline floor: the steps are held by software (dispatch, host work), not by "
                    f"the hardware's bandwidth or arithmetic")
        at_roof = f", its decode step {roof:.0%} at its roofline floor" if roof is not None else ""
        return f"{head}; the engine was busy {busy:.0%} of the window{at_roof}: the hardware is saturated at this load"

    def best_lever(self) -> dict[str, Any] | None:
        """The lever to pull, its predicted gain and its price, as the console and the report's top show it."""
        best = self.best
        if best is None:
            return None
        before = ((self.replay_check or {}).get("measured") or {}).get("output_throughput")
        after = (best.predicted or {}).get("output_throughput")
        rate = f" ({before:.1f} -> {after:.1f} output tok/s)" if before and after else ""
        text = (f"{best.flags} ({best.description}): predicted {best.predicted_gain:.2f}x output throughput{rate} "
                f"at this load; accuracy cost: {best.price}")
        return {"lever": best.lever, "flags": best.flags, "description": best.description,
                "predicted_gain": best.predicted_gain, "predicted": best.predicted, "price": best.price,
                "accuracy": best.accuracy, "changes_numbers": best.changes_numbers, "text": text}

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {"step_model": self.step_model, "replay_check": self.replay_check, "unknown": self.unknown,
                "best": best.lever if best else None, "best_flags": best.flags if best else None,
                "best_lever": self.best_lever(), "busy_fraction": self.busy_fraction, "roof_share": self.roof_share,
                "calibration": self.calibration, "verdict": self.verdict()}


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
    variant: str | None = None  # the calibrated execution variant whose forward a step takes (None: the run's)
    changes_numbers: bool = False
    accuracy: Mapping[str, Any] | None = None

    @property
    def add_flags(self) -> list[str]:
        return self.flags.split() if self.flags.startswith("--") and self.users is None else []


def candidate_levers(config: Mapping[str, Any], load: ReplayLoad, calibration: StepCalibration | None,
                     offer_load: bool = False, pool_in_blocks: bool = True) -> list[Lever]:
    """The levers that apply to a run of the bundled engine with ``config`` under ``load``: the scheduler's and
    the cache's, and every execution lever the calibration timed (:mod:`reports.levers.execution`); with
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
    if config.get("execution") == "eager" and not is_calibrated(calibration, "optimized"):
        out.append(Lever("execution", "--execution optimized", "the optimized execution path",
                         {"execution": "optimized"}, is_measured=False, note=calibration_note(calibration, "optimized")))
    out += [Lever(**spec) for spec in execution_lever_specs(calibration, config, pool_in_blocks)]
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


def predict_levers(data: RunDataset, offer_load: bool = False) -> Predictions:
    """Fit the step model on ``data``'s steps, replay its load, and predict every lever that applies."""
    if not data.has_engine_probes:
        return Predictions(unknown="the run has no engine steps to fit a step-time model on (an external server)")
    calibration = RunDirectory(data.path).load(CALIBRATION_NAME, StepCalibration)
    inputs = replay_inputs(data)
    # fitted where the throughput the replay is checked against, and the gains are scaled from, was counted
    window = None if isinstance(inputs, str) else load_window(data, inputs[1])
    model = fit_step_model(data.steps_in_window(), calibration=calibration, window=window)
    if model is None:
        return Predictions(unknown="too few busy engine steps to fit a step-time model")
    if isinstance(inputs, str):
        return Predictions(step_model=model.to_dict(), unknown=inputs)
    requests, load = inputs
    recorded = data.engine_config
    try:
        base_config = engine_config(recorded)
    except (ValueError, TypeError) as exc:
        return Predictions(step_model=model.to_dict(), unknown=f"the run's engine config cannot be replayed: {exc}")
    base = replay(base_config, requests, load, step_cost(model, base_config, base_config))
    measured = measured_figures(data, load)
    check = {"replayed": base.to_dict(), "measured": measured,
             "throughput_error": _error(base.steady_throughput, measured.get("steady_output_throughput"))}
    levers = []
    argv = list(data.load_info.serve_argv or []) if data.load_info is not None else []
    for lever in candidate_levers(recorded, load, calibration, offer_load, pool_in_blocks="--num-kv-blocks" in argv):
        levers.append(_predict_one(lever, recorded, requests, load, model, base, measured))
    levers.sort(key=lambda lv: -(lv.predicted_gain or 0.0))
    return Predictions(levers=levers, step_model=model.to_dict(), replay_check=check,
                       calibration=calibration_summary(calibration))


def calibration_summary(calibration: StepCalibration | None) -> dict[str, Any] | None:
    """What the step calibration timed, and what it cost (this run: nothing but reading it when it was cached)."""
    if calibration is None:
        return None
    return {"variants": list(calibration.forward_s), "batches": calibration.batches, "context": calibration.context,
            "cost_s": calibration.cost_s, "accuracy_s": calibration.accuracy_s, "cached": calibration.cached,
            "load_s": calibration.load_s, "failed": calibration.failed}


def step_cost(model: StepModel, config: EngineConfig, recorded: EngineConfig,
              variant: str | None = None) -> Callable[[SimStep], float]:
    """The fitted step time on ``config``, its forward the calibrated execution ``variant``'s (default: the run's
    own); burnt host time as the run measured it when the knob is unchanged."""
    if recorded.host_overhead_ms > 0:
        host_s = model.host_overhead_s * config.host_overhead_ms / recorded.host_overhead_ms
    else:
        host_s = config.host_overhead_ms / 1000
    path = variant

    def cost(step: SimStep) -> float:
        return model.step_time(step, host_s, path)

    return cost


def _predict_one(lever: Lever, recorded: Mapping[str, Any], requests: list[SimRequest], load: ReplayLoad,
                 model: StepModel, base: ReplayMeasures, measured: Mapping[str, Any]) -> LeverPrediction:
    pulls = {"add_flags": lever.add_flags, "drop_flags": list(lever.drop_flags), "users": lever.users,
             "changes_numbers": lever.changes_numbers,
             "accuracy": dict(lever.accuracy) if lever.accuracy is not None else None}
    if not lever.is_measured:
        return LeverPrediction(lever.lever, lever.flags, lever.description, None, note=lever.note, **pulls)
    config = engine_config(recorded, lever.changes)
    lever_load = dataclasses.replace(load, users=lever.users) if lever.users is not None else load
    result = replay(config, requests, lever_load, step_cost(model, config, engine_config(recorded), lever.variant))
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


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _error(predicted: float | None, measured: float | None) -> float | None:
    return (predicted - measured) / measured if predicted is not None and measured else None

