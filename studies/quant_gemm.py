"""The quantized GEMM kernel against the dense GEMMs it replaces, per row count, on SmolLM2-135M's shapes.

Two measurements, both on random weights of the model's exact shapes (the kernel's speed does not
depend on the values):

- ``stream``: one pass over every projection of all 30 layers plus the Q8_0 LM head at a few row
  counts, the bytes of the codes read per second against this machine's copy bandwidth
  (``probes/peaks.py``): a decode step's weight read, without the rest of the step; the layers with
  16-bit and with 8-bit activations (``--int4-act-bits``; the head takes 16 in both).
- ``rows``: per row count, the time of the 30 layers' projections through the kernel (Q4_1, 16-bit
  and 8-bit activations), through oneDNN's prepacked dense weight in bfloat16 and float32, and through
  torch's int4 kernel: where the kernel stops being the fastest is the crossover a step switches to a
  dense copy at.

Run under the exclusive lock::

    flock /tmp/ss-cpu.lock python -m studies.quant_gemm --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from engine.cpu_kernels import cpu_kernels
from engine.cpu_kernels.quant_pack import pack_int4, pack_int8
from engine.model.projection import Int4Projection, packed_or_dense
from engine.model.quant import Int4Groups, Int8Groups
from probes.peaks import measure_peaks

# SmolLM2-135M: fused QKV, O, fused gate/up, down ([out, in]); 30 layers; a 49152 x 576 head.
LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
NUM_LAYERS = 30
HEAD_SHAPE = (49152, 576)


def best_of(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cpu_model() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    flags = [f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
             if f in lscpu.split()]
    return f"{name} ({', '.join(flags) or 'no AVX-512'}), {platform.machine()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stream-rows", default="1,2,4,8,16")
    p.add_argument("--rows", default="1,4,8,16,32,64,128,256,512")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    kernels, why = cpu_kernels()
    if kernels is None:
        print(f"no kernels: {why}")
        return 1
    gen = torch.Generator().manual_seed(0)
    floats = [[torch.randn(n, k, generator=gen) * 0.02 for n, k in LAYER_SHAPES] for _ in range(NUM_LAYERS)]
    packed = [[pack_int4(Int4Groups.from_float(w)) for w in layer] for layer in floats]
    head = pack_int8(Int8Groups.from_float(torch.randn(*HEAD_SHAPE, generator=gen) * 0.02))
    stream_bytes = sum(w.nbytes for layer in packed for w in layer) + head.nbytes
    peaks = measure_peaks("cpu", "float32", dtypes=("float32",))
    copy_bw = peaks.bandwidth_bytes_per_s
    report: dict[str, object] = {"cpu": cpu_model(), "isa": kernels.isa, "threads": torch.get_num_threads(),
                                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                 "copy_bandwidth_gb_s": copy_bw / 1e9, "stream_bytes": stream_bytes}
    print(f"{report['date']}; {report['cpu']}; kernel {kernels.isa}; {report['threads']} threads; "
          f"copy bandwidth {copy_bw / 1e9:.1f} GB/s ({peaks.method})")

    inputs = {k: torch.randn(512, k, generator=gen) for k in (576, 1536)}
    stream: dict[str, dict[int, dict[str, float]]] = {}
    for act_bits in (16, 8):
        stream[f"a{act_bits}"] = {}
        for rows in map(int, args.stream_rows.split(",")):
            def one_pass(rows: int = rows, act_bits: int = act_bits) -> None:
                for layer in packed:
                    for w in layer:
                        kernels.quant_gemm(inputs[w.num_cols][:rows], w, act_bits=act_bits)
                kernels.quant_gemm(inputs[576][:rows], head)
            seconds = best_of(one_pass, args.repeats)
            stream[f"a{act_bits}"][rows] = {"ms": seconds * 1e3, "gb_s": stream_bytes / seconds / 1e9,
                                            "of_copy_bandwidth": stream_bytes / seconds / copy_bw}
            print(f"stream {stream_bytes / 1e6:.1f} MB at {rows:3d} rows, {act_bits:2d}-bit activations: "
                  f"{seconds * 1e3:6.2f} ms, {stream_bytes / seconds / 1e9:5.1f} GB/s = "
                  f"{stream_bytes / seconds / copy_bw:.0%} of copy")
    report["stream"] = stream

    forms: dict[str, list[list[Callable[[torch.Tensor], torch.Tensor]]]] = {
        "kernel-q4": [[(lambda x, w=w: kernels.quant_gemm(x, w)) for w in layer] for layer in packed],
        "kernel-q4-a8": [[(lambda x, w=w: kernels.quant_gemm(x, w, act_bits=8)) for w in layer] for layer in packed],
        # NOTE: oneDNN's packed layout where this CPU has it (bfloat16 needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT),
        # else F.linear, as the engine itself chooses; the line below the header says which ran.
        "dense-bf16": [[packed_or_dense(w.bfloat16()) for w in layer] for layer in floats],
        "dense-f32": [[packed_or_dense(w) for w in layer] for layer in floats],
        "torch-int4-bf16": [[Int4Projection(Int4Groups.from_float(w), torch.bfloat16) for w in layer]
                            for layer in floats],
    }
    dtypes = {"kernel-q4": torch.bfloat16, "kernel-q4-a8": torch.bfloat16, "dense-bf16": torch.bfloat16,
              "dense-f32": torch.float32, "torch-int4-bf16": torch.bfloat16}
    by_rows: dict[int, dict[str, float]] = {}
    kinds = {name: getattr(layers[0][0], "kind", name) for name, layers in forms.items()}
    report["kinds"] = kinds
    print(f"\n{'rows':>5} " + " ".join(f"{name:>16}" for name in forms) + "   (ms for 30 layers' projections)")
    print(f"{'':5} " + " ".join(f"{kinds[name]:>16}" for name in forms))
    for rows in map(int, args.rows.split(",")):
        by_rows[rows] = {}
        for name, layers in forms.items():
            xs = {k: v[:rows].to(dtypes[name]) for k, v in inputs.items()}

            def run(layers: list[list[Callable[[torch.Tensor], torch.Tensor]]] = layers,
                    xs: dict[int, torch.Tensor] = xs) -> None:
                for layer in layers:
                    for (_, k), fn in zip(LAYER_SHAPES, layer, strict=True):
                        fn(xs[k])
            by_rows[rows][name] = best_of(run, args.repeats if rows <= 64 else 2) * 1e3
        print(f"{rows:5d} " + " ".join(f"{by_rows[rows][name]:16.2f}" for name in forms))
    report["rows_ms"] = by_rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
