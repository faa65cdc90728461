"""The levers of someone else's server, in its own flags, with what can be predicted from outside.

Without the server's engine steps there is no step-time model to replay, so no gain is predicted
from a simulation. One bound can be read from ``/metrics``: when requests wait while the KV cache
has room, admitting them (more seats) gives at most (running + waiting) / running times the output
throughput, reached only if a step takes as long with more sequences in it (memory-bound decode).
"""

from __future__ import annotations

from reports.dataset import RunDataset
from reports.levers.predictions import LeverPrediction, Predictions
from reports.metric_adapters import metrics_adapter, prometheus_measures

# lever -> (what it does, {server family: the flag to try})
FLAGS: dict[str, tuple[str, dict[str, str]]] = {
    "max_num_seqs": ("more sequences per batch", {
        "vllm": "--max-num-seqs 2N", "sglang": "--max-running-requests 2N",
        "tgi": "--max-batch-size 2N (and --max-concurrent-requests)", "llamacpp": "--parallel 2N (llama-server -np)"}),
    "max_num_batched_tokens": ("a bigger token budget per step", {
        "vllm": "--max-num-batched-tokens 2x", "sglang": "--chunked-prefill-size 2x",
        "tgi": "--max-batch-prefill-tokens 2x", "llamacpp": "--batch-size 2x"}),
    "kv_pool": ("more KV cache memory", {
        "vllm": "--gpu-memory-utilization 0.95", "sglang": "--mem-fraction-static 0.9",
        "tgi": "--cuda-memory-fraction 1.0 (or a larger --max-batch-total-tokens)",
        "llamacpp": "--ctx-size 2x (shared by the --parallel slots)"}),
    "prefix_caching": ("prefix caching on", {
        "vllm": "--enable-prefix-caching", "sglang": "drop --disable-radix-cache",
        "tgi": "PREFIX_CACHING=1 (on by default since TGI 3)", "llamacpp": "--cache-reuse 256 (and cache_prompt)"}),
    "execution": ("the optimized execution path (CUDA graphs)", {
        "vllm": "drop --enforce-eager", "sglang": "drop --disable-cuda-graph",
        "tgi": "--cuda-graphs 1,2,4,8,16,32", "llamacpp": "--n-gpu-layers 999 (every layer on the GPU)"}),
}
UNPREDICTABLE = ("not predicted: without the server's engine steps there is no step-time model to replay; "
                 "try the flag and measure again with `servescope load --target`")


def external_predictions(data: RunDataset) -> Predictions:
    """One row per lever: the flag in the server's words (every family's when it is not known)."""
    adapter = metrics_adapter(data)
    family = adapter.name if adapter is not None else None
    prom = prometheus_measures(data)
    levers = []
    for lever, (description, by_family) in FLAGS.items():
        flags = by_family[family] if family in by_family else "; ".join(f"{k}: {v}" for k, v in by_family.items())
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
    return Predictions(levers=levers, unknown=f"an external server: {family_note}; gains need engine steps")
