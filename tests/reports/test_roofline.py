"""Roofline: measured peaks, and per-step FLOPs checked against torch's own FLOP counter on the real model."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from torch.utils.flop_counter import FlopCounterMode

from engine import EngineConfig, LLMEngine, SamplingParams, StepStats
from engine.weights.dummy import DUMMY_CONFIGS
from probes.model_shape import ModelShape, resolve_model_shape
from probes.peaks import MachinePeaks, measure_peaks
from probes.run_dir import RunDirectory
from reports.dataset import RunDataset
from reports.roofline import step_work
from reports.summary import point_measures
from reports.verdict.facts import facts_for


class _Steps:
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_step(self, stats: StepStats) -> None:
        self.rows.append({name: getattr(stats, name) for name in stats.__slots__} | {"total_s": stats.total_s})

    def on_request_event(self, event: object) -> None:
        pass


def test_peaks_are_measured_and_round_trip(tmp_path) -> None:
    peaks = measure_peaks("cpu", copy_mib=16, matmul_n=256, repeats=2)
    assert peaks.bandwidth_bytes_per_s > 0 and peaks.flops_per_s > 0
    assert math.isfinite(peaks.ridge_intensity)
    assert MachinePeaks.from_dict(peaks.to_dict()) == peaks
    assert RunDirectory(tmp_path).read_peaks() is None
    RunDirectory(tmp_path).write_peaks(peaks)
    assert RunDirectory(tmp_path).read_peaks() == peaks


def test_by_default_only_the_dtypes_the_device_computes_natively_are_measured() -> None:
    import torch

    from engine.model.projection import native_bf16_gemm
    from probes.peaks import native_peak_dtypes

    cpu = native_peak_dtypes(torch.device("cpu"))
    assert cpu == (("float32", "bfloat16") if native_bf16_gemm() is not None else ("float32",))
    peaks = measure_peaks("cpu", "float32", copy_mib=16, matmul_n=128, repeats=1)
    assert tuple(peaks.flops_by_dtype) == cpu  # an emulated bfloat16 GEMM is not timed


def test_peaks_are_measured_per_dtype_and_old_files_still_load() -> None:
    peaks = measure_peaks("cpu", "bfloat16", copy_mib=16, matmul_n=256, repeats=2, dtypes=("float32",))
    assert set(peaks.flops_by_dtype) == set(peaks.bandwidth_by_dtype) == {"float32", "bfloat16"}
    assert peaks.flops_per_s == peaks.flops_by_dtype["bfloat16"] and peaks.phase == "before the load"
    as_float32 = peaks.for_dtype("float32")
    assert (as_float32.dtype, as_float32.flops_per_s) == ("float32", peaks.flops_by_dtype["float32"])
    with pytest.raises(ValueError, match="float16"):
        peaks.for_dtype("float16")
    old = {k: v for k, v in peaks.to_dict().items() if k not in ("flops_by_dtype", "bandwidth_by_dtype",
                                                                   "num_threads", "phase")}
    assert MachinePeaks.from_dict(old).flops_per_s == peaks.flops_per_s  # a file from before per-dtype peaks


def test_step_flops_match_torchs_flop_counter_on_a_llama_shape() -> None:
    """The estimate's matmul FLOPs against an independent count of the ops the model really ran."""
    # NOTE: eager, because torch's FLOP counter knows aten's matmuls but not the oneDNN packed GEMMs of
    # the optimized CPU path; both run the same matmuls.
    engine = LLMEngine(EngineConfig(model="dummy:smollm2-shape", device="cpu", num_threads=1, max_model_len=256,
                                    execution="eager"))
    recorder = _Steps()
    engine.add_observer(recorder)
    for i in range(3):
        engine.add_request([(11 * i + j) % 250 + 1 for j in range(24 + 8 * i)],
                           SamplingParams(max_tokens=3, ignore_eos=True))
    shape = ModelShape.from_config("dummy:smollm2-shape", DUMMY_CONFIGS["smollm2-shape"], "float32")
    kinds = []
    while engine.has_unfinished():
        with FlopCounterMode(display=False) as counter:
            engine.step()
        work = step_work(pd.DataFrame(recorder.rows[-1:]), shape)
        kinds.append(work["kind"].iloc[0])
        assert work["flops"].iloc[0] == pytest.approx(counter.get_total_flops(), rel=0.1)
    assert {"prefill", "decode"} <= set(kinds)


def test_decode_intensity_rises_with_the_batch() -> None:
    """Weights are read once per step whatever the batch, so more sequences mean more FLOPs per byte."""
    shape = resolve_model_shape("smollm2-135m")
    assert shape is not None and shape.num_params > 100_000_000
    rows = [{"num_prefill_tokens": 0, "num_decode_tokens": b, "num_seqs": b, "num_running": b,
             "num_kv_slots_used": 100 * b, "total_s": 0.01, "forward_s": 0.008, "start_time": 0.0} for b in (1, 8, 64)]
    intensity = step_work(pd.DataFrame(rows), shape)["intensity"].tolist()
    assert intensity == sorted(intensity) and intensity[-1] > 10 * intensity[0]


def test_a_run_gets_mbu_and_mfu_for_decode_and_prefill(scenario_dir) -> None:
    data = RunDataset.load(scenario_dir("two-users-large-pool"))
    assert data.model_shape is not None  # recorded in run.json by the probe session
    roofline = facts_for(data, point_measures(data)).roofline
    assert roofline is not None and roofline.peaks is not None
    assert roofline.num_decode_steps > 0 and roofline.num_prefill_steps > 0
    for value in (roofline.decode_mbu, roofline.decode_mfu, roofline.prefill_mbu, roofline.prefill_mfu):
        assert value is not None and 0 < value < 1
    assert roofline.decode_forward_mbu >= roofline.decode_mbu  # the forward alone is a part of the step
    # The floor (the slower roof's time for the step's work) is what MBU or MFU says of the step.
    assert roofline.decode_floor_s is not None and 0 < roofline.decode_floor_s < roofline.decode_step_s
    assert roofline.above_roof == {}


def test_unknown_models_have_no_shape() -> None:
    assert resolve_model_shape(None) is None
    assert resolve_model_shape("some-org/some-model") is None


@pytest.mark.parametrize("weights", ["dense", "int4"])
def test_the_manifest_records_the_weight_bytes_a_step_reads_as_served(tmp_path, weights: str) -> None:
    from probes.session import ProbeSession

    engine = LLMEngine(EngineConfig(model="dummy:tiny", weights=weights))
    with ProbeSession.for_engine(engine, tmp_path / "run") as session:
        shape = session.manifest.model_shape
    assert shape is not None
    config = engine.model_config
    dense_bytes = config.num_params * 4  # float32, every parameter
    layers = engine.runner.model.model.layers
    if weights == "dense":
        # Dense: every projection and the (tied) head, all but the norms' few parameters.
        norms = (2 * config.num_layers + 1) * config.hidden_size * 4
        assert shape.weight_bytes == dense_bytes - norms
    else:
        # The 4-bit codes with their float16 scales and minima (20 bytes per 32 weights), a head of 8-bit codes
        # (34 per 32), whatever the model's float32 size says.
        codes = sum(p.packed.nbytes for layer in layers for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                                   layer.mlp.gate_up_proj, layer.mlp.down_proj))
        assert shape.weight_bytes == codes + engine.runner.model.lm_head.packed.nbytes
        assert shape.weight_bytes < dense_bytes / 4
    # What run.json holds reads back the same; a manifest written before the field existed reads as dense.
    reread = ModelShape.from_dict(shape.to_dict())
    assert reread.weight_bytes == shape.weight_bytes
    old = {k: v for k, v in shape.to_dict().items() if k != "served_weight_bytes"}
    assert ModelShape.from_dict(old).weight_bytes == dense_bytes
