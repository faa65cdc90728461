"""An ``LLM`` tab in Locust's web UI: TTFT, TPOT and ITL percentiles and output tokens/s, now and over the run.

Built from Locust's own stats entries of the ``LLM`` rows (see :func:`loadtests.client.load_context.report_token_rows`),
so on a master it shows every worker's requests. It uses the web UI's extension points: an extra tab
and table in the page's template arguments, and the table's rows added to each ``/stats/requests``
answer (the page polls it every few seconds, so the tab updates live).
"""

from __future__ import annotations

import json
from typing import Any

from loadtests.client.load_context import ITL_ROW, LLM_REQUEST_TYPE, OUTPUT_TOKENS_ROW, TPOT_ROW, TTFT_ROW

TAB_KEY = "servescope-llm"
TAB_TITLE = "LLM"
LATENCY_ROWS = (TTFT_ROW, TPOT_ROW, ITL_ROW)
COLUMNS = (
    ("metric", "Metric"), ("now", "Now (median of the last seconds)"), ("median", "Median, whole run"),
    ("p95", "95%ile, whole run"), ("p99", "99%ile, whole run"), ("samples", "Samples"),
)


def llm_table(stats: Any) -> list[dict[str, Any]]:
    """The tab's rows from a Locust ``RequestStats``: one per latency row (ms), and output tokens/s."""
    rows: list[dict[str, Any]] = []
    for name in LATENCY_ROWS:
        entry = stats.entries.get((name, LLM_REQUEST_TYPE))  # NOTE: never stats.get, which adds a row
        if entry is None or not entry.num_requests:
            continue
        rows.append({"metric": f"{name} (ms)", "now": entry.get_current_response_time_percentile(0.5),
                     "median": entry.median_response_time, "p95": entry.get_response_time_percentile(0.95),
                     "p99": entry.get_response_time_percentile(0.99), "samples": entry.num_requests})
    tokens = stats.entries.get((OUTPUT_TOKENS_ROW, LLM_REQUEST_TYPE))
    if tokens is not None and tokens.num_requests:
        rows.append({"metric": "output tokens/s", "now": round(tokens.current_rps, 1),
                     "median": round(tokens.total_rps, 1), "p95": "", "p99": "", "samples": tokens.num_requests})
    for row in rows:
        row["name"] = row["safe_name"] = row["metric"]
    return rows


def install(environment: Any) -> None:
    """Add the tab to ``environment``'s web UI (a master's or a local runner's)."""
    web_ui = environment.web_ui
    if web_ui is None:
        return
    # NOTE: update_template_args merges into these, so the tab stays on every render of the page.
    web_ui.template_args["extended_tabs"] = [{"title": TAB_TITLE, "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": key, "title": title} for key, title in COLUMNS]}]

    @web_ui.app.after_request
    def add_llm_rows(response: Any) -> Any:
        from flask import request

        if not (request.path.rstrip("/").endswith("/stats/requests") and response.is_json):
            return response
        body = response.get_json()
        # NOTE: Locust caches this answer for a few seconds and hands back the same object: the tab's
        # rows, added once, stay those of the stats beside them.
        if "extended_stats" not in body:
            body["extended_stats"] = [{"key": TAB_KEY, "data": llm_table(environment.runner.stats)}]
            response.set_data(json.dumps(body))
        return response
