"""The llama-server build's cmake line follows the CPU it is built on, and a cached build made for another
CPU is built again (the machines alternate between AVX-512 and AVX2-only CPUs). The build itself, about 10
minutes, runs in ``tox -e llama``."""

from __future__ import annotations

import pytest

from studies import llama_build
from studies.llama_build import AVX512_OPTIONS, FLAGS_FILE, cmake_flags

AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512vbmi",
                 "avx512_bf16"}
# The vector flags of a 2-core AMD EPYC (Zen 4) as its /proc/cpuinfo wrote them (2026-12-07).
ZEN4 = {"fma", "avx", "f16c", "avx2", "avx512f", "avx512dq", "avx512ifma", "avx512cd", "avx512bw", "avx512vl",
        "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx512_vnni", "avx512_bitalg", "avx512_vpopcntdq"}


def test_the_cmake_line_turns_on_only_the_avx512_extensions_the_cpu_has() -> None:
    avx2 = cmake_flags(AVX2)
    assert "-DGGML_AVX2=ON" in avx2 and "-DGGML_NATIVE=OFF" in avx2
    assert all(f"-D{option}=OFF" in avx2 for option in AVX512_OPTIONS.values())
    avx512 = cmake_flags(AVX512)
    assert all(f"-D{option}=ON" in avx512 for option in AVX512_OPTIONS.values())
    # the kernel's own spelling of each extension turns it on (a misspelt key left VBMI off on a Zen 4)
    assert all(f"-D{option}=ON" in cmake_flags(ZEN4) for option in AVX512_OPTIONS.values())
    # An extension is only on with AVX-512 itself; VNNI without BF16 leaves BF16 off.
    assert "-DGGML_AVX512_VNNI=OFF" in cmake_flags(AVX2 | {"avx512_vnni"})
    no_bf16 = cmake_flags(AVX512 - {"avx512_bf16"})
    assert "-DGGML_AVX512_VNNI=ON" in no_bf16 and "-DGGML_AVX512_BF16=OFF" in no_bf16
    # AMX stays off whatever the CPU has (a native build segfaulted on an AMX Xeon).
    amx = cmake_flags(AVX512 | {"amx_tile", "amx_int8", "amx_bf16"})
    assert {"-DGGML_AMX_INT8=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_BF16=OFF"} <= set(amx)


@pytest.mark.parametrize(("recorded", "rebuilt"), [("this", False), ("other", True), (None, True)])
def test_a_cached_build_made_for_another_cpu_is_built_again(tmp_path, monkeypatch, recorded, rebuilt) -> None:
    binary = tmp_path / "build" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")  # answers --version as a built server does
    binary.chmod(0o755)
    monkeypatch.delenv(llama_build.ENV_BINARY, raising=False)
    monkeypatch.setattr(llama_build, "cpu_flags", lambda: AVX2)
    if recorded is not None:
        flags = cmake_flags(AVX2 if recorded == "this" else AVX512)
        (tmp_path / "build" / FLAGS_FILE).write_text("\n".join(flags) + "\n")
    builds = []
    monkeypatch.setattr(llama_build, "build", lambda cache: builds.append(cache))
    assert llama_build.llama_server_binary(tmp_path) == binary
    assert builds == ([tmp_path] if rebuilt else [])
