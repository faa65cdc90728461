"""A run's requests, load and own figures as the replay takes them (:mod:`reports.levers.predictions`).

The closed-loop users take the plan's requests in order; an open loop's arrive at their send times.
The run's figures are its window's (finished requests) and its steady rate (the engine's token times
while sending), which counts a request still in flight when the load stopped by its progress.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from probes.replay import ReplayLoad, SimRequest, pseudo_token_ids
from probes.run_dir import PLAN_NAME
from reports.dataset import RunDataset


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
    if config.get("warmup_s") is not None and config.get("duration_s") and not config.get("stop_rule"):
        # NOTE: a fixed load sends until its warm-up plus its duration, whenever its first measured request went
        # out: a closed loop's can come long after the warm-up ended (users in lockstep behind a stalled step),
        # and a window of the full duration from there runs into the drain, which the replay, still sending,
        # does not have
        duration = min(duration, float(config["warmup_s"]) + float(config["duration_s"]) - warmup) or duration
    decided = info.decided_window if info is not None else None
    if decided is not None:
        # NOTE: a point that its stopping rule ended sent until its decided window's end, not for its duration cap:
        # three 60 s points of a hold that ended at 26-43 s replayed 22-86% above what they measured, the replay
        # sending on where the load had stopped and the measured rate counted over the drain after it
        duration = decided[1] - decided[0]
    gap = closed_loop_gap_s(rows, int(users), data.frame("requests")) if users else client_gap_s(data)
    return requests, ReplayLoad(users=int(users) if users else None, warmup_s=warmup, duration_s=duration,
                                gap_s=gap)


def closed_loop_gap_s(rows: pd.DataFrame, users: int, engine: pd.DataFrame | None = None) -> float:
    """A closed-loop user's time outside the engine per request (think time, client work, the transport both
    ways): by Little's law each user cycles through its request's time in the engine plus that gap, so gap =
    users / send rate - mean time in the engine (over the sends, which all users take part in; the drain after
    the last send would bias the rate). The time in the engine is its own arrival to finish where ``engine``
    (the engine's request rows) has the request, else the client's E2E.

    NOTE: with the client's E2E in place of the engine's time, what happens between the engine and the client
    counted as engine time, and a lever that made the engine faster was predicted to shorten it: a 2-user run
    of a tiny model whose int4 engine finished a request in 13 ms, while its client got the first token 47 ms
    after sending (the cause not found), was predicted 2.2x and measured 1.06x.
    """
    span = float(rows["send_time"].max() - rows["send_time"].min())
    if span <= 0 or len(rows) < 2:
        return 0.0
    in_engine = rows["e2e_s"]
    if engine is not None and len(engine) and "request_id" in rows:
        own = (engine["finish_time"] - engine["arrival_time"]).set_axis(engine["request_id"])
        own = own[~own.index.duplicated()]
        in_engine = rows["request_id"].map(own).fillna(rows["e2e_s"])
    return max(users * span / (len(rows) - 1) - float(in_engine.mean()), 0.0)


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


def load_window(data: RunDataset, load: ReplayLoad) -> tuple[float, float] | None:
    """While the load was sending, after its warm-up: where the run's steady throughput is counted."""
    client = data.client
    if client is None or not len(client) or not load.duration_s > 0:
        return None
    start = float(client["send_time"].min()) + load.warmup_s
    return start, start + load.duration_s


def measured_figures(data: RunDataset, load: ReplayLoad) -> dict[str, Any]:
    """The run's own figures, the ones its predictions are scaled from and a retest is judged on.

    ``output_throughput`` is the output tokens the engine streamed per second while the load was sending (from
    the end of the warm-up for the load's duration; ``steady_output_throughput`` is the same figure): what the
    replay's gains are ratios of, and what a request counts by its progress, finished or not.
    ``window_output_throughput`` is the report's figure: the measured requests' tokens over their window (first
    measured send to last measured end), which a queue stretches far past the load (a request sent late waits
    behind every earlier one), so it is not a throughput to scale.

    NOTE: the steady rate counts the engine's own token times: a stream's chunk may carry several tokens.
    """
    lat = data.latencies
    ok = lat[lat["is_ok"]] if len(lat) else lat
    window = data.window[1] - data.window[0]
    sending = load_window(data, load)
    if sending is None:
        return {}
    start = sending[0]
    engine = data.frame("requests")
    times = [t for row in engine["token_times"] if row is not None for t in row] if len(engine) else []
    steady = sum(1 for t in times if start < t <= start + load.duration_s) / load.duration_s
    figures = {"output_throughput": steady, "steady_output_throughput": steady}
    if len(ok) and window > 0:
        return {**figures, "window_output_throughput": float(ok["num_output_tokens"].sum()) / window,
                "ttft_p50": float(ok["ttft_s"].median()), "tpot_p50": float(ok["tpot_s"].median())}
    # no measured request finished: the first tokens that came, and the in-flight requests' pace
    arrived = engine[engine["arrival_time"] >= start] if len(engine) else engine
    ttft = arrived["ttft_s"].dropna() if len(arrived) else arrived
    return {**figures, "window_output_throughput": None, "ttft_p50": float(ttft.median()) if len(ttft) else None,
            "tpot_p50": in_flight_tpot(arrived), "by_progress": True}


def in_flight_tpot(requests: pd.DataFrame) -> float | None:
    """The median time per output token after the first of requests that may not have finished (engine token times)."""
    if not len(requests):
        return None
    per_token = [(row[-1] - row[0]) / (len(row) - 1) for row in requests["token_times"] if row is not None and len(row) > 1]
    return float(pd.Series(per_token).median()) if per_token else None
