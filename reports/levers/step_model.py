"""A step-time model fitted on a run's own engine steps: a few coefficients with a physical meaning.

One busy engine step takes ``overhead + prefill x c_prefill + decode x c_decode + context x c_context``
seconds of wall time, step start to next step start (so the server's own work between steps, its
HTTP and streaming threads sharing the cores, is part of the per-step cost), less the time the
``--host-overhead-ms`` knob burnt on purpose, which is known and added back by whoever predicts.

- ``overhead_s``: the fixed cost of a step whatever it holds (scheduling, Python, launches);
- ``prefill_token_s``: each prompt token computed (the weights applied to one more row);
- ``decode_seq_s``: each sequence decoding one token (its row, sampling, streaming the token out);
- ``context_token_s``: each cached token the step's attention reads.

With a step calibration (:mod:`probes.step_calibration`: a decode step timed at batch sizes 1, 2, 4, ...
before the load) the step's dependence on the batch size is measured, not fitted: a step costs the
calibrated step of its decoding sequences (at least one row: the forward and, where the calibration's
sequences sampled as the load's do, their sampling, which a batch pays per row), plus the linear
terms above fitted on what is left, i.e. what the loaded server adds to that forward (its host work,
prompt rows, context beyond the calibrated one). The rest of the loaded machine (the server's HTTP
threads, the load client on the same cores) takes a share of the CPU from every step, so the calibrated
step is first stretched by the run's **load factor**: its decode steps' median forward over the
calibrated forward at their batch size (1.38 in a float32 run of 32 users over 2 seats, where the
int4 way's forward then ran 1.35 times its calibrated one, not the same milliseconds more). A batch size the run never reached then costs what the calibration measured for it, not a
line drawn through the one or two sizes the run had. Without a calibration the forward term is zero
and the linear terms carry everything; in a run whose batch never changed size the per-sequence
cost then cannot be told from the per-step cost, and the fit, preferring fewer terms, predicts a
bigger batch to cost what this one did.

The coefficients and the load factor are fitted on the busy steps while the load was sending (the window
the run's throughput is counted over, which the replay is checked against and the levers' gains are scaled
from), by non-negative least squares (a cost cannot be negative), on a random 80% of the steps; the error is
measured on the other 20%. Over a calibrated base the per-step term may go below zero, down to minus the
calibrated step's host part (its step beyond its forward, stretched by the load factor) at the run's smallest
step: a loaded step can pay less host time than the calibration's did, never less than none. The calibrated
step is the best of two per batch size, and in a 2-second dummy run of the test suite on a slowed host
(2026-12-07) it read 4.9 ms at 4 sequences against 3.5-4.0 loaded; held at zero or above, that term left every
step predicted too slow and the replay 28% under the measured throughput (3% with it). Left free, it traded
-120 ms a step for +7 ms a sequence in 24-32-user runs of smollm2-135m, a line no batch size the run lacked would
follow; bounded, it reads -0.6 to -3.8 ms there and their replays and lever gains move by 1% or less.
``forward`` is the same model fitted on the model forward alone; the execution lever uses it for the prompt rows
of a step.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from probes.step_calibration import StepCalibration

FEATURES = ("overhead_s", "prefill_token_s", "decode_seq_s", "context_token_s")
HOLDOUT_SHARE = 0.2
# A step whose period is longer than this many times its own phases was followed by an idle gap.
IDLE_GAP_FACTOR = 3.0
MIN_STEPS = 8
# Fewer busy steps than this while the load was sending (a short load of long prompt steps): the fit takes every
# measured step instead, a longer period but not four coefficients fitted on a few dozen steps.
MIN_WINDOW_STEPS = 50
# A step this many robust standard deviations slower than the fit predicts was stalled (see :func:`fit_step_model`).
STALL_SIGMAS = 5.0


@dataclass(frozen=True, slots=True)
class StepWork:
    """What one step did: the inputs of the step-time model."""

    num_prefill_tokens: int
    num_decode_tokens: int
    num_context_tokens: int


@dataclass(frozen=True, slots=True)
class Coefficients:
    overhead_s: float
    prefill_token_s: float
    decode_seq_s: float
    context_token_s: float

    def predict(self, work: StepWork) -> float:
        return (self.overhead_s + self.prefill_token_s * work.num_prefill_tokens
                + self.decode_seq_s * work.num_decode_tokens + self.context_token_s * work.num_context_tokens)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class StepModel:
    """The fitted step time (``total``) and model-forward time (``forward``), with held-out errors.

    With a ``calibration`` both are fitted over the calibrated forward of the step's decoding sequences
    (see the module's docstring), and the context term counts the tokens beyond the calibrated context.
    """

    total: Coefficients
    forward: Coefficients
    num_fit_steps: int
    num_holdout_steps: int
    holdout_mape: float  # mean |predicted - measured| / measured over held-out steps
    holdout_total_error: float  # (sum predicted - sum measured) / sum measured over held-out steps
    mean_step_s: float
    host_overhead_s: float = 0.0  # mean host time a step burnt for --host-overhead-ms (a stall in it not counted)
    calibration: StepCalibration | None = None
    load_factor: float = 1.0  # the run's loaded forward over the calibrated one (:func:`load_factor`)
    stall_share: float = 0.0  # the share of the busy wall time that went to stalled steps' excess (:func:`fit_step_model`)

    @property
    def stall_factor(self) -> float:
        """Every predicted step is stretched by this: the stalls took the same share of a lever's time."""
        return stall_stretch(self.stall_share)

    def calibrated_forward(self, work: StepWork, path: str | None = None) -> float:
        """The calibrated forward of the step's decoding sequences (at least one row) on ``path``; 0 uncalibrated."""
        if self.calibration is None:
            return 0.0
        return self.load_factor * self.calibration.forward(path or self.calibration.run_path,
                                                           max(work.num_decode_tokens, 1))

    def calibrated_step(self, work: StepWork) -> float:
        """The run's own calibrated decode step at the step's decoding sequences (:func:`calibrated_base`), stretched
        by the load factor."""
        if self.calibration is None:
            return 0.0
        return self.load_factor * float(calibrated_base([max(work.num_decode_tokens, 1)], self.calibration)[0])

    def linear_work(self, work: StepWork) -> StepWork:
        """What the linear terms see: with a calibration, only the context beyond the calibrated one."""
        if self.calibration is None:
            return work
        return StepWork(work.num_prefill_tokens, work.num_decode_tokens,
                        work.num_context_tokens - work.num_decode_tokens * self.calibration.context)

    def step_time(self, work: StepWork, host_overhead_s: float = 0.0, path: str | None = None) -> float:
        """Predicted seconds for a step on the calibrated execution variant ``path`` (an execution path, a dtype,
        quantized weights, an attention backend; default the run's own), plus the host time a
        ``--host-overhead-ms`` setting burns.

        On another variant the step saves what the calibration measured it to save on the forward of its
        decoding sequences, stretched by the load factor (the rest of the loaded machine takes the same share
        of either variant's forward), and on its prompt rows the share it saved on a calibrated prompt chunk;
        the fitted terms (per step, per sequence, per token) stay.
        """
        own = self.calibrated_step(work) + self.total.predict(self.linear_work(work))
        saved = 0.0
        if self.calibration is not None and path is not None and path != self.calibration.run_path:
            calibration = self.calibration
            ratio = calibration.prefill_ratio(path)
            if ratio is None:  # a calibration without a timed prompt chunk: the share saved at the largest batch
                largest = calibration.batches[-1]
                ratio = calibration.forward(calibration.run_path, largest) / calibration.forward(path, largest)
            row_share = 1.0 - 1.0 / ratio
            saved = (self.calibrated_forward(work) - self.calibrated_forward(work, path)
                     + self.forward.prefill_token_s * work.num_prefill_tokens * row_share)
        return (max(own - saved, 0.0) + host_overhead_s) * self.stall_factor

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total.to_dict(), "forward": self.forward.to_dict(), "num_fit_steps": self.num_fit_steps,
                "num_holdout_steps": self.num_holdout_steps, "holdout_mape": self.holdout_mape,
                "holdout_total_error": self.holdout_total_error, "mean_step_s": self.mean_step_s,
                "host_overhead_s": self.host_overhead_s, "calibrated": self.calibration is not None,
                "load_factor": self.load_factor, "stall_share": self.stall_share,
                "calibration_batches": self.calibration.batches if self.calibration is not None else None}


def nnls(a: np.ndarray, b: np.ndarray, lower: np.ndarray | None = None) -> np.ndarray:
    """Least squares ``a @ x ~ b`` with ``x >= lower`` (default zero): the best unconstrained fit over every
    subset of columns, of ``x - lower`` against what ``lower`` leaves of ``b``.

    NOTE: exact for the handful of columns this module fits (2**4 subsets); not meant for wide problems.
    """
    if lower is not None:
        return lower + nnls(a, b - a @ lower)
    num_cols = a.shape[1]
    best, best_residual = np.zeros(num_cols), float(np.sum(b ** 2))
    for size in range(1, num_cols + 1):
        for cols in itertools.combinations(range(num_cols), size):
            x_sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
            if np.any(x_sub < 0):
                continue
            residual = float(np.sum((a[:, cols] @ x_sub - b) ** 2))
            if residual < best_residual - 1e-18:
                best = np.zeros(num_cols)
                best[list(cols)] = x_sub
                best_residual = residual
    return best


def step_features(steps: pd.DataFrame, calibration: StepCalibration | None = None) -> np.ndarray:
    """One row per step: ``[1, prefill tokens, decoding sequences, context tokens]``.

    The context is ``num_kv_slots_used``: the computed tokens of the running requests after the step,
    what their next attention reads (the simulator counts it the same way); with a ``calibration``,
    less the calibrated context of each decoding sequence (that part is in the calibrated forward).
    """
    decode = steps["num_decode_tokens"].to_numpy(float)
    context = steps["num_kv_slots_used"].to_numpy(float)
    if calibration is not None:
        context = context - decode * calibration.context
    return np.column_stack([np.ones(len(steps)), steps["num_prefill_tokens"].to_numpy(float), decode, context])


def calibrated_forward_s(steps: pd.DataFrame, calibration: StepCalibration | None) -> np.ndarray:
    """Each step's calibrated forward of its decoding sequences (at least one row); zeros without a calibration."""
    if calibration is None:
        return np.zeros(len(steps))
    decode = steps["num_decode_tokens"].to_numpy(float)
    return np.array([calibration.forward(calibration.run_path, max(d, 1.0)) for d in decode])


def calibrated_base(batches: Sequence[float], calibration: StepCalibration) -> np.ndarray:
    """The run's own calibrated cost of a decode step at each of ``batches`` sequences, the base the fitted terms
    add to: the whole step (forward, sampling, the engine's host phases) where the calibration's sequences
    sampled as the load's do (``temperature`` recorded), else the forward alone.

    NOTE: an older calibration sampled greedily, an argmax per row, while the load's requests sample at
    temperature 1 (a softmax and a draw over the vocabulary per row: 0.1 ms for smollm2-135m on 2 cores, 1.2
    ms before the sampler's draw stopped using ``torch.multinomial``); its step would not carry a per-sequence
    cost the load has, so its forward is the base and the fit's per-sequence term carries the sampling, from
    the batch sizes the run had.
    """
    table = calibration.step if calibration.temperature is not None else calibration.forward
    return np.array([table(calibration.run_path, max(b, 1.0)) for b in batches])


def load_factor(busy: pd.DataFrame, calibration: StepCalibration | None) -> float:
    """How much slower the run's decode forwards ran than the calibration's at their batch sizes: the median
    of loaded forward over calibrated forward on the busy decode-only steps (1.0 without a calibration or
    such steps).

    NOTE: a run whose batch barely changes (2 seats always full) cannot tell a cost per step from one per
    sequence or one in proportion to the forward; the same run's forward against the calibration's can:
    the loaded machine's share of the CPU stretches the forward in proportion (measured on int4 and float32
    ways alike), and a lever that changes the forward or the batch keeps that proportion.
    """
    if calibration is None:
        return 1.0
    decode = busy[busy["num_prefill_tokens"] == 0]
    if not len(decode):
        return 1.0
    calibrated = calibrated_forward_s(decode, calibration)
    return float(np.median(decode["forward_only_s"].to_numpy(float) / calibrated))


def busy_periods(steps: pd.DataFrame) -> pd.DataFrame:
    """Steps followed at once by another, with ``period_s`` (start to next start, less burnt host time).

    A step followed by an idle gap (nothing to run) is left out: its period is not its cost. A gap after a
    step that left requests running or waiting is not idle: the engine had work and was not run (the
    process stalled between steps); it stays, and the fit finds it a stall (:func:`stalled_steps`).
    """
    steps = steps.sort_values("start_time").reset_index(drop=True)
    period = steps["start_time"].shift(-1) - steps["start_time"]
    own = steps["total_s"]
    had_work = ((steps["num_running"] + steps["num_waiting"]) > 0 if {"num_running", "num_waiting"} <= set(steps)
                else pd.Series(False, index=steps.index))
    is_busy = period.notna() & ((period <= own * IDLE_GAP_FACTOR + 0.002) | had_work)
    out = steps[is_busy].copy()
    # NOTE: the burn runs to a deadline; one that took longer than the run's usual burn was stalled, and the
    # excess stays in the period, where the fit finds the stall
    burns = steps["host_overhead_s"][steps["host_overhead_s"] > 0]
    out["burnt_s"] = out["host_overhead_s"].clip(upper=float(burns.median())) if len(burns) else out["host_overhead_s"]
    out["period_s"] = (period[is_busy] - out["burnt_s"]).clip(lower=0.0)
    out["forward_only_s"] = out["forward_s"]
    return out


def fit_step_model(steps: pd.DataFrame, seed: int = 0, calibration: StepCalibration | None = None,
                   window: tuple[float, float] | None = None) -> StepModel | None:
    """Fit on the busy steps of one run (over ``calibration``'s forward when given) that started inside ``window``
    (the load's sending window; every step when it is None or holds fewer than ``MIN_WINDOW_STEPS``); None when
    there are too few to fit and hold some out. The stalls' share of the time (:func:`stalled_steps`) is taken
    over the part of each step's period inside ``window``.

    NOTE: a queued closed loop's measured requests run long past the load into the drain (0-40 s against a
    20 s load), and on a shared machine the engine's speed drifts between such periods (its decode forward
    1.6 times slower in one 5-second slice than the next): steps fitted over the drain describe another machine
    than the one whose throughput the replay is checked against and the levers' gains are scaled from. Stalls
    come in bursts likewise."""
    busy = busy_periods(steps)
    if window is not None:
        inside = busy[(busy["start_time"] >= window[0]) & (busy["start_time"] < window[1])]
        if len(inside) >= MIN_WINDOW_STEPS:
            busy = inside.reset_index(drop=True)
    if len(busy) < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    is_holdout = rng.random(len(busy)) < HOLDOUT_SHARE
    if is_holdout.sum() == 0 or (~is_holdout).sum() < len(FEATURES):
        is_holdout = np.arange(len(busy)) % 5 == 0
    x = step_features(busy, calibration)
    factor = load_factor(busy, calibration)
    base_forward = factor * calibrated_forward_s(busy, calibration)
    base = (factor * calibrated_base(busy["num_decode_tokens"].to_numpy(float), calibration)
            if calibration is not None else base_forward)
    y = busy["period_s"].to_numpy(float)
    y_forward = busy["forward_only_s"].to_numpy(float)
    # the per-step term may take back the calibrated host part (the step beyond its forward) of the run's smallest step
    lower = np.zeros(len(FEATURES))
    lower[FEATURES.index("overhead_s")] = -max(float(np.min(base - base_forward)), 0.0)
    total = Coefficients(*map(float, nnls(x[~is_holdout], (y - base)[~is_holdout], lower)))
    is_stall = stalled_steps(y - base - x @ _vector(total))
    if is_stall.any():  # the stalls' excess is time, not work: fit the work without them
        total = Coefficients(*map(float, nnls(x[~is_holdout & ~is_stall], (y - base)[~is_holdout & ~is_stall], lower)))
    fit = ~is_holdout & ~is_stall
    forward = Coefficients(*map(float, nnls(x[fit], (y_forward - base_forward)[fit])))
    modelled = base + x @ _vector(total)
    burnt = busy["burnt_s"].to_numpy(float)
    stall_share = max(_stall_share(y + burnt, modelled + burnt, is_stall, busy["start_time"].to_numpy(float),
                                   window), 0.0)
    predicted = ((modelled + burnt) * stall_stretch(stall_share) - burnt)[is_holdout]
    measured = y[is_holdout]
    positive = measured > 0
    mape = float(np.mean(np.abs(predicted[positive] - measured[positive]) / measured[positive])) if positive.any() \
        else float("nan")
    total_error = float((predicted.sum() - measured.sum()) / measured.sum()) if measured.sum() > 0 else float("nan")
    return StepModel(total=total, forward=forward, num_fit_steps=int(fit.sum()),
                     num_holdout_steps=int(is_holdout.sum()), holdout_mape=mape, holdout_total_error=total_error,
                     mean_step_s=float(y.mean()), host_overhead_s=float(busy["burnt_s"].mean()),
                     calibration=calibration, load_factor=factor, stall_share=stall_share)


def _stall_share(measured: np.ndarray, modelled: np.ndarray, is_stall: np.ndarray, start: np.ndarray,
                 window: tuple[float, float] | None) -> float:
    """The stalled steps' excess over the modelled step, as a share of the busy wall time: in ``window`` where it
    holds steps, each step counted by the share of its period (``measured``, start to next start) inside it, so
    a step that started just before the window's end and stalled past it counts only its part inside."""
    weight = np.ones(len(start))
    if window is not None:
        overlap = np.minimum(start + measured, window[1]) - np.maximum(start, window[0])
        weight = np.clip(overlap / np.maximum(measured, 1e-12), 0.0, 1.0)
        if not weight.any():
            weight = np.ones(len(start))
    busy = float(np.sum(measured * weight))
    return float(np.sum(((measured - modelled) * weight)[is_stall]) / busy) if busy > 0 else 0.0


def stall_stretch(stall_share: float) -> float:
    """How much longer a step takes when stalls take ``stall_share`` of the wall time (at most 90% of it)."""
    return 1.0 / (1.0 - min(stall_share, 0.9))


def _vector(coefficients: Coefficients) -> np.ndarray:
    return np.array(list(coefficients.to_dict().values()))


def stalled_steps(residual: np.ndarray) -> np.ndarray:
    """The steps far slower than the fit predicts: ``STALL_SIGMAS`` robust standard deviations (from the median
    absolute deviation) above the median residual.

    NOTE: on a shared machine the engine's process is sometimes not run at all for a while (another process,
    a page fault storm, a collector pass): the step in flight takes that long. That time is a share of the
    run's wall time, not a cost of the work the step held; fitted as work it lands on whichever features that
    step happened to have (a prompt's tokens, its batch size), or, held out, nowhere, and a 2-second replay
    then missed the measured throughput by 10-24% on a loaded machine. Fitted without them, and their
    excess carried as a share of the time (``StepModel.stall_share``), every step and every lever's step
    pays the same share.
    """
    centre = float(np.median(residual))
    sigma = 1.4826 * float(np.median(np.abs(residual - centre)))
    if sigma <= 0.0:
        return np.zeros(len(residual), dtype=bool)
    return residual > centre + STALL_SIGMAS * sigma
