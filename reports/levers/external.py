"""The levers of someone else's server, in its own flags, with what can be predicted from outside.

Without the server's engine steps there is no step-time model to replay, so no gain is predicted
from a simulation. One bound can be read from ``/metrics``: when requests wait while the KV cache
has room, admitting them (more seats) gives at most (running + waiting) / running times the output
throughput, reached only if a step takes as long with more sequences in it (memory-bound decode).
"""

from __future__ import annotations

from probes.run_dir import RunDirectory
from probes.server_info import SERVER_INFO_NAME, ServerInfo
from reports.dataset import RunDataset
from reports.levers.predictions import LeverPrediction, Predictions
from reports.metric_adapters import metrics_adapter, prometheus_measures

# lever -> (what it does, {server family: the flag to try}); {slots} and {ctx} are the server's own figures
# where it reports them (llama-server's /props, server_info.json).
FLAGS: dict[str, tuple[str, dict[str, str]]] = {
    "max_num_seqs": ("more sequences per batch", {
        "vllm": "--max-num-seqs 2N", "sglang": "--max-running-requests 2N",
        "tgi": "--max-batch-size 2N (and --max-concurrent-requests)",
        "llamacpp": "-np {more_slots} (--parallel; {slots} slots now), with -c grown to keep each slot's context"}),
    "max_num_batched_tokens": ("a bigger token budget per step", {
        "vllm": "--max-num-batched-tokens 2x", "sglang": "--chunked-prefill-size 2x",
        "tgi": "--max-batch-prefill-tokens 2x", "llamacpp": "-b 2x and -ub 2x (--batch-size / --ubatch-size)"}),
    "kv_pool": ("more KV cache memory", {
        "vllm": "--gpu-memory-utilization 0.95", "sglang": "--mem-fraction-static 0.9",
        "tgi": "--cuda-memory-fraction 1.0 (or a larger --max-batch-total-tokens)",
        "llamacpp": "-c 2x (--ctx-size; a slot holds {ctx} tokens now): with -kvu one pool the slots share, "
                    "without it split evenly among them"}),
    "prefix_caching": ("prefix caching on", {
        "vllm": "--enable-prefix-caching", "sglang": "drop --disable-radix-cache",
        "tgi": "PREFIX_CACHING=1 (on by default since TGI 3)", "llamacpp": "--cache-reuse 256 (and cache_prompt)"}),
    "execution": ("the optimized execution path (CUDA graphs)", {
        "vllm": "drop --enforce-eager", "sglang": "drop --disable-cuda-graph",
        "tgi": "--cuda-graphs 1,2,4,8,16,32",
        "llamacpp": "-t / -tb (decode and prompt threads: one per physical core), or --n-gpu-layers 999 on a GPU"}),
    "http_threads": ("more HTTP threads", {
        "llamacpp": "--threads-http N (default max(-np + 4, cores - 1) fixed threads, more spawned on demand)"}),
}
UNPREDICTABLE = ("not predicted: without the server's engine steps there is no step-time model to replay; "
                 "try the flag and measure again with `servescope load --target`")


def external_predictions(data: RunDataset) -> Predictions:
    """One row per lever: the flag in the server's words (every family's when it is not known)."""
    adapter = metrics_adapter(data)
    family = adapter.name if adapter is not None else None
    prom = prometheus_measures(data)
    levers = []
    figures = _server_figures(data)
    for lever, (description, by_family) in FLAGS.items():
        if family is not None and family not in by_family:
            continue
        flags = by_family[family] if family in by_family else "; ".join(f"{k}: {v}" for k, v in by_family.items())
        flags = flags.format(**figures)
        gain, note = None, UNPREDICTABLE
        if lever == "max_num_seqs" and prom is not None and prom.mean_running and prom.mean_waiting is not None \
                and (prom.kv_usage_peak is None or prom.kv_usage_peak < 0.9):
            gain = (prom.mean_running + prom.mean_waiting) / prom.mean_running
            note = (f"at most {gain:.2f}x: (running {prom.mean_running:.1f} + waiting {prom.mean_waiting:.1f}) / "
                    f"running, reached only if a step takes as long with more sequences (an upper bound, not a "
                    f"replay)")
        levers.append(LeverPrediction(lever, flags, description, None, note=note,
                                      predicted={"gain_upper_bound": gain} if gain is not None else None))
    family_note = f"the {family} server's flags" if family else "the server family is unknown: every family's flags"
    if figures["slots"] != "N":
        family_note += f" (it reports {figures['slots']} slots of {figures['ctx']} tokens each)"
    return Predictions(levers=levers, unknown=f"an external server: {family_note}; gains need engine steps")


def _server_figures(data: RunDataset) -> dict[str, str]:
    """The slot count and per-slot context the server reported (llama-server's /props), for its flags."""
    info = RunDirectory(data.path).load(SERVER_INFO_NAME, ServerInfo)
    slots = info.num_slots if info is not None else None
    ctx = info.slot_context if info is not None else None
    return {"slots": str(slots) if slots else "N", "more_slots": str(2 * slots) if slots else "2N",
            "ctx": str(ctx) if ctx else "its share of"}
