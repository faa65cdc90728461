"""The quantized GEMM kernel (engine/cpu_kernels/quant_gemv.c) against float64 references and the torch path.

Three references, from tight to loose:
- the kernel's own arithmetic in float64 (its 16-bit or 8-bit activations, the packed codes and scales):
  equal to float32 accumulation error, so every code, scale and row lands where the layout says;
- the exact product of the unquantized activations with the weight, in float64: the kernel may differ by
  at most what rounding the activations to 16 or 8 bits allows (each activation moves by at most half its
  group's step), a bound computed per output, not a tolerance picked to pass;
- torch's own path over the same weight (F.linear on the dequantized weight), held to the same bound.
Shapes: GQA's fused QKV (9 query heads, 3 KV heads), row counts that are not whole tiles, odd batch
sizes, both activation dtypes; and the library built for the other CPU vendor and for a CPU without
AVX-512, run where this CPU can run it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engine.cpu_kernels import cpu_kernels, load_library
from engine.cpu_kernels.build import TARGETS, build_library
from engine.cpu_kernels.quant_pack import PackedWeight, pack_int4, pack_int8
from engine.model.quant import Int4Groups, Int8Groups
from engine.weights.fetch import default_cache_dir

KERNELS, WHY = cpu_kernels()
needs_kernels = pytest.mark.skipif(KERNELS is None, reason=f"the CPU kernels cannot be built here: {WHY}")
GQA_QKV_ROWS = (9 + 2 * 3) * 64  # SmolLM2's fused Q/K/V: 9 query heads, 3 KV heads of 64


def _weights(num_rows: int, num_cols: int, seed: int) -> tuple[PackedWeight, PackedWeight]:
    weight = torch.randn(num_rows, num_cols, generator=torch.Generator().manual_seed(seed)) * 0.05
    return pack_int4(Int4Groups.from_float(weight)), pack_int8(Int8Groups.from_float(weight))


def _activations(num_rows: int, num_cols: int, seed: int) -> torch.Tensor:
    x = torch.randn(num_rows, num_cols, generator=torch.Generator().manual_seed(seed + 1))
    x[:, :32] *= 20.0  # one group with an outlier scale, as real activations have
    return x


LEVELS = {16: 32767, 8: 127}  # the largest code of 16-bit and 8-bit activations


def _reference_activations(x: torch.Tensor, act_bits: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and steps by the kernel's rule: round(x * (L / max|x|)), max|x| * (1 / L) per group (L = LEVELS)."""
    levels = LEVELS[act_bits]
    grouped = x.float().view(x.shape[0], -1, 32)
    amax = grouped.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, levels / amax, torch.zeros_like(amax))
    step = amax * torch.tensor(1 / levels, dtype=torch.float32)
    return torch.round(grouped * inv).to(torch.int16).view_as(x), step.squeeze(-1)


def _kernel_arithmetic(x: torch.Tensor, packed: PackedWeight, act_bits: int = 16) -> torch.Tensor:
    """What the kernel computes, in float64: the dequantized weight times the rounded activations, except
    Q4_1's minimum term, which takes the unquantized sum of x."""
    codes, steps = _reference_activations(x, act_bits)
    rounded = (codes.double().view(x.shape[0], -1, 32) * steps.double().unsqueeze(-1)).view_as(x)
    weight = packed.dequantize().double()
    if packed.bits == 8:
        return rounded @ weight.T
    mins = weight.view(weight.shape[0], -1, 32).amin(-1)  # code 0 exists in every Q4_1 group from_float made
    above_min = weight.view(weight.shape[0], -1, 32) - mins.unsqueeze(-1)
    sums = x.double().view(x.shape[0], -1, 32).sum(-1)
    return rounded @ above_min.reshape_as(weight).T + sums @ mins.T


def _rounding_bound(x: torch.Tensor, packed: PackedWeight, act_bits: int = 16) -> torch.Tensor:
    """Largest error rounded activations can cause per output: sum over k of |w - min| (Q4) or |w| (Q8) * step / 2."""
    _, scales = _reference_activations(x, act_bits)
    weight = packed.dequantize().double().view(packed.num_rows, -1, 32)
    if packed.bits == 4:
        weight = weight - weight.amin(-1, keepdim=True)
    return (scales.double() / 2) @ weight.abs().sum(-1).T  # [M, N]


@needs_kernels
@pytest.mark.parametrize("act_bits", [16, 8])
def test_activations_are_rounded_as_the_reference_rounds_them(act_bits: int) -> None:
    x = _activations(7, 96, seed=3)
    x[2, 32:64] = 0.0  # an all-zero group: step 0, codes 0
    codes, steps, sums = KERNELS.quantize_activations(x, act_bits)
    want_codes, want_steps = _reference_activations(x, act_bits)
    assert torch.equal(codes, want_codes) and int(codes.abs().max()) == LEVELS[act_bits]
    assert torch.equal(steps, want_steps)
    torch.testing.assert_close(sums, x.view(7, -1, 32).sum(-1), rtol=1e-6, atol=1e-5)
    bf16_codes, *_ = KERNELS.quantize_activations(x.bfloat16(), act_bits)
    assert torch.equal(bf16_codes, _reference_activations(x.bfloat16().float(), act_bits)[0])


@needs_kernels
@pytest.mark.parametrize("num_rows", [1, 37, 16, GQA_QKV_ROWS])
@pytest.mark.parametrize("batch", [1, 3, 4, 6, 17])
@pytest.mark.parametrize("act_bits", [16, 8])
def test_kernel_computes_its_arithmetic_exactly_and_stays_within_the_rounding_bound(num_rows: int, batch: int,
                                                                                    act_bits: int) -> None:
    num_cols = 576 if num_rows == GQA_QKV_ROWS else 96
    x = _activations(batch, num_cols, seed=num_rows)
    exact_x = x.double()
    for packed in _weights(num_rows, num_cols, seed=num_rows + batch):
        if act_bits == 8 and packed.bits == 8:
            continue  # 8-bit activations are for 4-bit codes only (refused: see below)
        got = KERNELS.quant_gemm(x, packed, act_bits=act_bits).double()
        assert got.shape == (batch, num_rows)
        own = _kernel_arithmetic(x, packed, act_bits)
        # float32 accumulation over num_cols / 32 groups of exact integer dot products
        torch.testing.assert_close(got, own, rtol=1e-5, atol=1e-5 * float(own.abs().max()))
        exact = exact_x @ packed.dequantize().double().T
        bound = _rounding_bound(x, packed, act_bits)
        slack = 1e-5 * float(exact.abs().max())
        assert bool(((got - exact).abs() <= bound + slack).all()), (packed.bits, float((got - exact - bound).max()))
        torch_path = F.linear(x, packed.dequantize()).double()
        assert bool(((got - torch_path).abs() <= bound + slack).all())


@needs_kernels
@pytest.mark.parametrize("act_bits", [16, 8])
def test_bfloat16_activations_give_bfloat16_outputs_of_the_same_products(act_bits: int) -> None:
    x = _activations(5, 576, seed=11).bfloat16()
    for packed in _weights(GQA_QKV_ROWS, 576, seed=12):
        if act_bits == 8 and packed.bits == 8:
            continue
        got = KERNELS.quant_gemm(x, packed, act_bits=act_bits)
        assert got.dtype == torch.bfloat16
        want = KERNELS.quant_gemm(x.float(), packed, act_bits=act_bits)  # the same bf16 values, float32 output
        assert torch.equal(got, want.bfloat16())  # the kernel rounds its float32 sums to nearest even


@needs_kernels
def test_eight_bit_activations_are_coarser_than_sixteen() -> None:
    """The 8-bit path really rounds to 8 bits: its error against the exact product is the larger one."""
    x = _activations(3, 576, seed=41)
    packed, _ = _weights(GQA_QKV_ROWS, 576, seed=42)
    exact = x.double() @ packed.dequantize().double().T
    errors = {bits: float((KERNELS.quant_gemm(x, packed, act_bits=bits).double() - exact).abs().max())
              for bits in (16, 8)}
    assert errors[8] > 10 * errors[16] > 0


@needs_kernels
def test_kernel_refuses_what_it_cannot_multiply() -> None:
    packed, packed8 = _weights(16, 64, seed=0)
    with pytest.raises(ValueError, match="8-bit ones with 4-bit weights"):
        KERNELS.quant_gemm(torch.randn(2, 64), packed8, act_bits=8)
    with pytest.raises(ValueError, match="8-bit ones with 4-bit weights"):
        KERNELS.quant_gemm(torch.randn(2, 64), packed, act_bits=12)
    from engine.model.kernel_projection import KernelQuantProjection

    with pytest.raises(ValueError, match="8-bit ones with 4-bit weights"):  # refused when the model is built
        KernelQuantProjection(KERNELS, packed8, act_bits=8)
    with pytest.raises(ValueError, match="64"):
        KERNELS.quant_gemm(torch.randn(2, 96), packed)
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        KERNELS.quant_gemm(torch.randn(2, 64).half(), packed)
    with pytest.raises(ValueError, match="multiple of 32"):
        Int8Groups.from_float(torch.randn(4, 40))
    with pytest.raises(ValueError, match="contiguous uint8"):
        PackedWeight(packed.data[:, :1], 4, 16, 64)


def test_packing_keeps_the_ggufs_bytes_per_weight_and_round_trips() -> None:
    weight = torch.randn(37, 64, generator=torch.Generator().manual_seed(5))
    groups4, groups8 = Int4Groups.from_float(weight), Int8Groups.from_float(weight)
    packed4, packed8 = pack_int4(groups4), pack_int8(groups8)
    assert packed4.nbytes == 48 * 64 // 32 * 20 and packed8.nbytes == 48 * 64 // 32 * 34  # 37 rows -> 3 tiles
    half4 = Int4Groups(groups4.codes, groups4.scales.half().float(), groups4.mins.half().float())
    assert torch.equal(packed4.dequantize(), half4.dequantize())
    assert torch.equal(packed8.dequantize(), groups8.dequantize())  # Q8_0 scales are float16 already


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return set(next((ln for ln in f if ln.startswith("flags")), "").split())
    except OSError:
        return set()


# What a target's code needs of the CPU to run; the Intel and AMD flag sets are at least compiled everywhere.
RUNS_WITH = {"avx2-no-avx512": {"avx2", "fma", "f16c"}, "x86-64-baseline": set(),
             "amd-zen4": {"avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512vbmi"},
             "intel-sapphirerapids": {"avx512f", "avx512_vnni", "amx_tile", "avx512_fp16"}}
# The code path each build takes: every variant of the C source is run where the CPU allows.
ISA_OF = {"avx2-no-avx512": "avx2", "x86-64-baseline": "scalar", "amd-zen4": "avx512-vnni",
          "intel-sapphirerapids": "avx512-vnni"}


@needs_kernels
@pytest.mark.parametrize("target", [t for t in TARGETS if t != "native"])
def test_every_cpu_target_builds_and_those_this_cpu_runs_give_the_same_numbers(target: str) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler is not None
    path = build_library(compiler, default_cache_dir() / "kernels", target)
    if not RUNS_WITH[target] <= _cpu_flags():
        pytest.skip(f"built {path.name}; this CPU lacks {sorted(RUNS_WITH[target] - _cpu_flags())} to run it")
    other = load_library(path)
    assert other.isa == ISA_OF[target]
    x = _activations(9, 576, seed=21)
    packed4, packed8 = _weights(GQA_QKV_ROWS, 576, seed=22)
    # NOTE: the same rounded activations and the same order of float operations per output in every build;
    # one row too, and nine (a full block of 8 in the AVX-512 build, then one), whose last row block of one the
    # AVX2 and AVX-512 builds multiply in their own tile (the byte planes)
    for packed, act_bits in ((packed4, 16), (packed8, 16), (packed4, 8)):
        for rows in (x[:1], x[:6], x):
            assert torch.equal(other.quant_gemm(rows, packed, act_bits=act_bits),
                               KERNELS.quant_gemm(rows, packed, act_bits=act_bits)), (target, other.isa, act_bits)


def test_native_build_names_its_instruction_set(tmp_path: Path) -> None:
    if KERNELS is None:
        pytest.skip(WHY)
    flags = _cpu_flags()
    want = "avx512-vnni" if {"avx512f", "avx512bw", "avx512_vnni"} <= flags else \
        "avx2" if {"avx2", "fma", "f16c"} <= flags else "scalar"
    assert KERNELS.isa == want


@needs_kernels
def test_a_projection_with_a_dense_copy_takes_it_from_its_row_count_on() -> None:
    from engine.model.kernel_projection import KernelQuantProjection
    from engine.model.projection import DenseProjection

    packed, _ = _weights(40, 64, seed=31)
    dense = DenseProjection(packed.dequantize())
    projection = KernelQuantProjection(KERNELS, packed, dense, dense_from_rows=5)
    x = _activations(6, 64, seed=32)
    assert torch.equal(projection(x[:4]), KERNELS.quant_gemm(x[:4], packed))
    assert torch.equal(projection(x[:5]), F.linear(x[:5], packed.dequantize()))
    with pytest.raises(ValueError, match="go together"):
        KernelQuantProjection(KERNELS, packed, dense)


def test_int4_dense_rows_and_act_bits_are_int4_options() -> None:
    from engine import EngineConfig

    with pytest.raises(ValueError, match="int4_dense_rows applies to weights='int4'"):
        EngineConfig(int4_dense_rows=64)
    with pytest.raises(ValueError, match="int4_act_bits applies to weights='int4'"):
        EngineConfig(int4_act_bits=8)
    with pytest.raises(ValueError, match="int4_act_bits must be 8 or 16"):
        EngineConfig(weights="int4", int4_act_bits=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="int4_dense_rows must be a positive integer"):
        EngineConfig(weights="int4", int4_dense_rows=0)
