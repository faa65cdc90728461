"""Take the single-stream reference of a ``--users N`` run (``single_stream.json``; see :mod:`probes.single_stream`).

After the load has drained, the run's own first planned requests are sent one at a time, each on a
fresh connection that is closed after it (a probe holds no server connection between uses), and
timed by the same stream timer as the load's requests: TPOT is (finish - first token) / (tokens - 1).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from loadtests.client.load_context import API_PATHS, request_body
from loadtests.client.sse import StreamTimer
from loadtests.plan import read_plan
from loadtests.run.target import Target
from probes.run_dir import PLAN_NAME, RunDirectory
from probes.single_stream import SINGLE_STREAM_NAME, SingleStream

NUM_REQUESTS = 3
TIMEOUT_S = 300.0


def measure_single_stream(run_dir: Path, target: Target, api: str, ignore_eos: bool, api_key: str | None = None,
                          num_requests: int = NUM_REQUESTS) -> SingleStream:
    """Send the first ``num_requests`` of the run's plan alone, in turn; saved into ``run_dir``."""
    plan = read_plan(run_dir / PLAN_NAME)[:num_requests]
    if not plan:
        raise ValueError(f"{run_dir / PLAN_NAME} holds no planned request")
    reference = SingleStream(num_requests=len(plan), measured_at=time.time(),
                             method=f"the run's first {len(plan)} planned requests, one at a time after the load, "
                                    f"each on a fresh connection")
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    for item in plan:
        prompt = item.prompt if item.prompt_token_ids is None or api == "chat" else item.prompt_token_ids
        body = request_body(target.model, api, prompt, item.max_tokens, ignore_eos)
        status, error, timer, send = _stream(f"{target.url}{API_PATHS[api]}", body, headers, api)
        timing = timer.finish() if timer is not None else None
        error = error or (timing.error if timing is not None else None)
        if error is not None or timing is None:
            reference.errors.append({"status_code": status, "error": error})
            continue
        if timing.first_token_time is not None:
            reference.ttft_s.append(timing.first_token_time - send)
        n = timing.num_output_tokens
        if timing.first_token_time is not None and timing.end_time is not None and n >= 2:
            reference.tpot_s.append((timing.end_time - timing.first_token_time) / (n - 1))
    RunDirectory(run_dir).save(SINGLE_STREAM_NAME, reference)
    return reference


def _stream(url: str, body: dict, headers: dict[str, str], api: str) -> tuple[int, str | None, StreamTimer | None,
                                                                               float]:
    """``(status, error, timer, send time)`` of one streamed request (status 0: no HTTP answer)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    send = time.time()
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:  # noqa: S310 - the target's URL
            timer = StreamTimer(api)
            for raw in response:
                timer.feed(raw.decode("utf-8", errors="replace").rstrip("\r\n"), time.time())
            return int(response.status), None, timer, send
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}: {exc.read(1 << 12).decode('utf-8', errors='replace')[:300]}", None, send
    except (urllib.error.URLError, OSError) as exc:
        return 0, f"{type(exc).__name__}: {exc}", None, send
