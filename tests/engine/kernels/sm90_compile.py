"""Compile every kernel for Hopper (sm_90) ahead of time; run as a script, it prints JSON.

Run in its own process without ``TRITON_INTERPRET``: under the interpreter the kernels (and the
``@triton.jit`` helpers they call) are interpreter objects that Triton's compiler rejects.
"""

from __future__ import annotations

import json
import warnings

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels._interpreter import is_interpreted
from engine.kernels.kv_store import _kv_store_kernel
from engine.kernels.paged_decode import _paged_decode_kernel
from engine.kernels.paged_prefill import _paged_prefill_kernel
from engine.kernels.rmsnorm import _rms_norm_kernel
from engine.kernels.silu_mul import _silu_mul_kernel

HOPPER = GPUTarget("cuda", 90, 32)
# (activation dtype, index dtype): both metadata widths the wrappers accept get compiled.
VARIANTS = ["bf16-i64", "fp16-i32"]
FLOAT_ARGS = {"scale_log2e", "eps"}
INDEX_POINTERS = {"block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr", "slot_mapping_ptr"}

# Constexprs as SmolLM2-135M (9 heads over 3 KV heads, head_dim 64, hidden 576) launches them.
KERNELS = {
    "paged_decode": (_paged_decode_kernel, {"GROUP": 3, "HEAD_DIM": 64, "BLOCK_N": 64, "EMULATE_BF16": False}),
    "paged_prefill": (_paged_prefill_kernel,
                      {"GROUP": 3, "HEAD_DIM": 64, "BLOCK_M": 64, "BLOCK_N": 64, "EMULATE_BF16": False}),
    "kv_store": (_kv_store_kernel, {"HEAD_DIM": 64, "BLOCK_H": 4}),
    "rms_norm": (_rms_norm_kernel, {"HAS_RESIDUAL": True, "BLOCK": 1024, "EMULATE_BF16": False}),
    "silu_mul": (_silu_mul_kernel, {"BLOCK": 1024, "EMULATE_BF16": False}),
}


def signature(kernel: triton.JITFunction, variant: str, constexprs: dict[str, object]) -> dict[str, str]:
    dtype, index_dtype = variant.split("-")
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = f"*{index_dtype}" if name in INDEX_POINTERS else f"*{dtype}"
        else:
            types[name] = "fp32" if name in FLOAT_ARGS else "i32"
    return types


def compile_one(name: str, variant: str) -> dict[str, object]:
    kernel, constexprs = KERNELS[name]
    assert not is_interpreted(kernel), "run without TRITON_INTERPRET"
    try:
        source = ASTSource(fn=kernel, signature=signature(kernel, variant, constexprs), constexprs=constexprs)
        compiled = triton.compile(source, target=HOPPER)
    except Exception as error:  # reported back to the test, which fails with the message
        return {"error": f"{type(error).__name__}: {error}"}
    return {"cubin_bytes": len(compiled.asm["cubin"]), "wgmma": "wgmma" in compiled.asm["ptx"]}


def main() -> None:
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
    results = {f"{name}-{variant}": compile_one(name, variant) for name in KERNELS for variant in VARIANTS}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
