"""The execution levers a run is offered: only what the device runs natively, each with its flags and name."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig
from probes import execution_variants as ev
from probes.execution_variants import ExecutionVariant, execution_variants

CPU = torch.device("cpu")


def names(config: EngineConfig) -> list[str]:
    return [v.name for v in execution_variants(config, CPU)]


def test_a_cpu_with_native_bfloat16_is_offered_bfloat16_and_quantized_weights_with_bfloat16_activations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev, "native_dtypes", lambda device: ("float32", "bfloat16"))
    monkeypatch.setattr(ev, "c_kernels_isa", lambda: "avx512-vnni")  # no 8-bit activations offered there
    assert names(EngineConfig()) == ["dtype=bfloat16", "dtype=bfloat16,weights=int8", "dtype=bfloat16,weights=int4",
                                     "attention_backend=torch"]
    # an eager run is offered the optimized path first, and the C kernel as its attention
    assert names(EngineConfig(execution="eager"))[0] == "optimized"
    assert names(EngineConfig(execution="eager"))[-1] == "attention_backend=cpu"
    # a bfloat16 run keeps its dtype: no wider dtype, quantized weights in bfloat16
    assert names(EngineConfig(dtype="bfloat16")) == ["weights=int8", "weights=int4", "attention_backend=torch"]
    assert names(EngineConfig(dtype="bfloat16", weights="int8")) == ["weights=int4", "attention_backend=torch"]


def test_a_cpu_that_would_emulate_bfloat16_is_offered_int4_on_the_c_kernel_with_float32_activations_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev, "native_dtypes", lambda device: ("float32",))
    monkeypatch.setattr(ev, "c_kernels_isa", lambda: "scalar")
    assert names(EngineConfig()) == ["weights=int4", "attention_backend=torch"]
    assert names(EngineConfig(weights="int4")) == ["attention_backend=torch"]
    monkeypatch.setattr(ev, "c_kernels_isa", lambda: None)  # no kernels: torch's int4 path would want bfloat16
    assert names(EngineConfig()) == ["attention_backend=torch"]


def test_the_avx2_kernels_are_offered_eight_bit_activations_beside_int4(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ev, "c_kernels_isa", lambda: "avx2")
    monkeypatch.setattr(ev, "native_dtypes", lambda device: ("float32",))
    assert names(EngineConfig()) == ["weights=int4", "int4_act_bits=8,weights=int4", "attention_backend=torch"]
    assert names(EngineConfig(weights="int4")) == ["int4_act_bits=8", "attention_backend=torch"]
    assert names(EngineConfig(weights="int4", int4_act_bits=8)) == ["attention_backend=torch"]
    monkeypatch.setattr(ev, "native_dtypes", lambda device: ("float32", "bfloat16"))
    assert "dtype=bfloat16,int4_act_bits=8,weights=int4" in names(EngineConfig())
    eight = ExecutionVariant({"weights": "int4", "int4_act_bits": 8})
    assert eight.flags == "--weights int4 --int4-act-bits 8" and eight.changes_numbers


def test_a_variant_names_its_flags_and_whether_it_changes_the_numbers() -> None:
    int4 = ExecutionVariant({"dtype": "bfloat16", "weights": "int4"})
    assert int4.flags == "--dtype bfloat16 --weights int4" and int4.changes_numbers
    backend = ExecutionVariant({"attention_backend": "torch"})
    assert backend.flags == "--attention-backend torch" and not backend.changes_numbers
    assert ExecutionVariant({"execution": "optimized"}).name == "optimized"
