"""The report's "What each lever would buy" section.

It shows the predicted gain of every lever (replayed through the engine's scheduler with the step
model fitted on this run), the step model with its held-out error, the replay of the run's own
settings against what was measured, and, after a ``--retest`` round, before / predicted / measured.
"""

from __future__ import annotations

from typing import Any

from reports.html.sections import Block, ReportContext, Section, note, share, table
from reports.levers.predictions import WORTH_PULLING


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.1f}"


class LeverSection(Section):
    anchor, title = "levers", "What each lever would buy"

    def blocks(self, ctx: ReportContext) -> list[Block | None]:
        d = ctx.diagnosis
        predictions: dict[str, Any] = d.predictions or {}
        if not predictions:
            return [note("No predictions: the run has no verdict.")]
        out: list[Block | None] = [note(f"Prediction: {predictions.get('verdict')}.")]
        pulled = predictions.get("retest")
        if pulled is not None:
            out.append(retest_table(pulled))
        if d.levers:
            rows, marks = [], []
            for lever in d.levers:
                p = lever.get("predicted") or {}
                rows.append([lever["lever"], lever["flags"], _x(lever.get("predicted_gain")),
                             p.get("output_throughput"), _ms(p.get("ttft_p50")), _ms(p.get("tpot_p50")),
                             _x(lever.get("measured_gain")), lever.get("price") or "–",
                             "yes" if lever.get("worth_pulling") else "no", lever.get("note") or ""])
                marks.append(lever["lever"] == predictions.get("best"))
            out.append(table(["lever", "flags", "predicted gain", "output tok/s", "TTFT p50 ms", "TPOT p50 ms",
                              "measured gain", "accuracy cost", f"worth pulling (>= {WORTH_PULLING:.2f}x)", "note"],
                             rows, caption="Gains are ratios of output throughput at this load, replayed through the "
                                           "engine's own scheduler with the fitted step time; a lever that changes the "
                                           "numbers the model computes shows what it costs in accuracy, measured on "
                                           "the served model before the load (greedy-token agreement with this run's "
                                           "configuration and the largest logit difference, on fixed prompts)",
                             highlight=marks))
        model = predictions.get("step_model")
        if model is not None:
            t = model["total"]
            calibrated = bool(model.get("calibrated"))
            per_step = "per-step ms over the calibrated step" if calibrated else "per-step overhead ms"
            out.append(table(
                [per_step, "per prefill token us", "per decoding sequence us", "per context token us",
                 "held-out steps", "held-out mean abs error", "held-out total error"],
                [[t["overhead_s"] * 1e3, t["prefill_token_s"] * 1e6, t["decode_seq_s"] * 1e6,
                  t["context_token_s"] * 1e6, model["num_holdout_steps"], share(model["holdout_mape"]),
                  f"{model['holdout_total_error']:+.1%}"]],
                caption="Step-time model fitted (non-negative least squares) on 80% of this run's busy steps, "
                        "checked on the other 20%" + ("; over the calibrated decode step, whose level the per-step "
                                                      "term corrects up or down" if calibrated else "")))
        check = predictions.get("replay_check")
        if check is not None:
            r, m = check["replayed"], check["measured"]
            error = check.get("throughput_error")
            out.append(table(["", "output tok/s while sending", "output tok/s (measured window)", "TTFT p50 ms",
                              "TPOT p50 ms"],
                             [["measured", m.get("steady_output_throughput"), m.get("window_output_throughput"),
                               _ms(m.get("ttft_p50")), _ms(m.get("tpot_p50"))],
                              ["replayed, same settings", r.get("steady_throughput"), r.get("output_throughput"),
                               _ms(r.get("ttft_p50")), _ms(r.get("tpot_p50"))]],
                             caption=f"The replay of this run's own settings vs what was measured (output tokens "
                                     f"per second while the load was sending: "
                                     f"{'error ' + format(error, '+.1%') if error is not None else 'not compared'})"))
        calibration = predictions.get("calibration")
        if calibration is not None:
            paid = (f"read from the cache in {calibration.get('load_s') or 0.0:.2f} s (measured in "
                    f"{calibration['cost_s']:.1f} s by an earlier run)" if calibration.get("cached")
                    else f"{calibration['cost_s']:.1f} s")
            out.append(note(f"Step calibration before the load: {', '.join(calibration['variants'])} at batch sizes "
                            f"{', '.join(map(str, calibration['batches']))} ({calibration['context']}-token contexts); "
                            f"it cost this run {paid}."))
        if predictions.get("unknown"):
            out.append(note(f"Not predicted: {predictions['unknown']}."))
        return out


def retest_table(pulled: dict[str, Any]) -> Block:
    rows = []
    for key, label, fmt in (("output_throughput", "output tok/s", None), ("ttft_p50", "TTFT p50 ms", _ms),
                            ("tpot_p50", "TPOT p50 ms", _ms)):
        show = fmt or (lambda v: v)
        error = pulled["errors"].get(key)
        rows.append([label, show(pulled["before"].get(key)), show(pulled["predicted"].get(key)),
                     show(pulled["measured"].get(key)), f"{error:+.1%}" if error is not None else "–"])
    return table(["measure", "before", "predicted", "measured", "prediction error"], rows,
                 caption=f"This round pulled {pulled['flags']} ({pulled['description']}): predicted "
                         f"{_x(pulled.get('predicted_gain'))}, measured {_x(pulled.get('measured_gain'))} output "
                         f"throughput (before: {pulled['before_dir']})")

