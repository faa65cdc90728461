"""The Arrow schema of every table a run directory can hold, in one place for writers and readers.

Probes write their tables with exactly these schemas; :mod:`probes.loader` checks a file against
them. A table may gain columns over time (readers ignore extras) but never loses or retypes one.
"""

from __future__ import annotations

from types import MappingProxyType

import pyarrow as pa

from probes.run_dir import CLIENT_HEALTH_TABLE, CLIENT_TABLE

_F64 = pa.float64()
_I64 = pa.int64()
_STR = pa.string()
_F64_LIST = pa.list_(pa.float64())

# The phases of an engine step: name -> its column of seconds in STEPS, in the table's order.
STEP_PHASES: dict[str, str] = {"schedule": "schedule_s", "prepare": "prepare_s", "forward": "forward_s",
                               "sample": "sample_s", "output": "output_s", "host": "host_overhead_s"}
STEPS = pa.schema([
    ("step_index", _I64),
    ("start_time", _F64),  # time.time() at step start
    ("schedule_s", _F64),
    ("prepare_s", _F64),
    ("forward_s", _F64),
    ("sample_s", _F64),
    ("output_s", _F64),
    ("host_overhead_s", _F64),
    ("total_s", _F64),
    ("num_seqs", _I64),
    ("num_prefill_tokens", _I64),
    ("num_decode_tokens", _I64),
    ("num_running", _I64),
    ("num_waiting", _I64),
    ("num_kv_blocks_used", _I64),
    ("num_kv_blocks_free", _I64),
    ("num_kv_blocks_cached", _I64),
    ("num_kv_slots_allocated", _I64),
    ("num_kv_slots_used", _I64),
    ("num_preemptions", _I64),
    ("num_prefix_hit_tokens", _I64),
])

# One row per request. Times are time.time(); a null means the event never happened (a request
# still in flight when the run stopped has no finish_time).
REQUESTS = pa.schema([
    ("request_id", _STR),
    ("arrival_time", _F64),
    ("queued_time", _F64),
    ("first_scheduled_time", _F64),
    ("first_token_time", _F64),
    ("finish_time", _F64),
    ("finish_reason", _STR),
    ("is_finished", pa.bool_()),
    ("num_prompt_tokens", _I64),
    ("num_output_tokens", _I64),
    ("num_cached_tokens", _I64),
    ("num_preemptions", _I64),
    ("token_times", _F64_LIST),
    ("queue_time_s", _F64),
    ("ttft_s", _F64),
    ("tpot_s", _F64),
    ("itl_s", _F64_LIST),
    ("e2e_s", _F64),
])

NVML = pa.schema([
    ("time", _F64),
    ("gpu_index", _I64),
    ("gpu_util_pct", _F64),
    ("mem_util_pct", _F64),
    ("mem_used_bytes", _I64),
    ("mem_total_bytes", _I64),
    ("power_w", _F64),
    ("sm_clock_mhz", _F64),
])

HOST = pa.schema([
    ("time", _F64),
    ("process_cpu_pct", _F64),  # may pass 100 when the process uses several cores
    ("process_rss_bytes", _I64),
    ("process_num_threads", _I64),
    ("system_cpu_pct", _F64),
    ("per_core_pct", _F64_LIST),
])

# One row per sample of one scrape; labels are a JSON object with sorted keys.
PROMETHEUS = pa.schema([
    ("time", _F64),
    ("scrape_index", _I64),
    ("family", _STR),
    ("type", _STR),
    ("sample", _STR),
    ("labels", _STR),
    ("value", _F64),
])

# The load generator's rows (loadtests.client.table merges every worker's journal into them).
# NOTE: times are epoch seconds (loadtests.client.records.Clock); derived columns are null when their
# inputs are (a failed request has no ttft_s).
CLIENT_REQUESTS = pa.schema([
    ("worker", _STR),
    ("seq", _I64),
    ("plan_index", _I64),
    ("group", _STR),
    ("is_warmup", pa.bool_()),
    ("scheduled_time", _F64),
    ("send_time", _F64),
    ("first_byte_time", _F64),
    ("first_token_time", _F64),
    ("end_time", _F64),
    ("token_times", _F64_LIST),
    ("status_code", _I64),
    ("error", _STR),
    ("finish_reason", _STR),
    ("request_id", _STR),
    ("num_prompt_tokens", _I64),
    ("num_output_tokens", _I64),
    ("num_cached_tokens", _I64),
    ("has_usage", pa.bool_()),
    ("planned_prompt_tokens", _I64),
    ("max_tokens", _I64),
    ("num_retries", _I64),  # sent again once: the pooled connection closed before any answer
    ("retry_error", _STR),
    ("server_prompt_s", _F64),  # the server's own timings, when its stream carries them (llama.cpp)
    ("server_decode_s", _F64),
    ("server_decode_tokens", _I64),
    ("is_ok", pa.bool_()),
    ("ttft_s", _F64),  # send -> first content token
    ("tpot_s", _F64),  # (finish - first token) / (output tokens - 1)
    ("e2e_s", _F64),  # send -> finish chunk
    ("itl_s", _F64_LIST),  # gaps between content chunks
])

# Each load worker's own health, sampled every 0.2 s (loadtests.client.health): how late its event
# loop woke (every token time of that worker shares the lag) and its CPU time over the gap, as a
# share of one core.
CLIENT_HEALTH = pa.schema([
    ("worker", _STR),
    ("time", _F64),
    ("loop_lag_s", _F64),
    ("cpu_share", _F64),
])

TABLE_SCHEMAS: MappingProxyType[str, pa.Schema] = MappingProxyType({
    "steps": STEPS,
    "requests": REQUESTS,
    "nvml": NVML,
    "host": HOST,
    "prometheus": PROMETHEUS,
    CLIENT_TABLE: CLIENT_REQUESTS,
    CLIENT_HEALTH_TABLE: CLIENT_HEALTH,
})
