"""Compile the CPU kernels' C sources into one shared library, cached by everything the code depends on.

The key is the sources, the flags, the compiler's version and this CPU's feature flags: a machine with
another CPU (the pool alternates AMD EPYC and Intel Xeon) or another compiler builds its own copy.
``march`` other than ``native`` builds for another CPU (the tests compile for the other vendor's flag
set and for a machine without AVX-512, and run what this CPU can run).
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import tempfile
from pathlib import Path

_HERE = Path(__file__).parent
SOURCES = (_HERE / "paged_decode.c", _HERE / "quant_gemv.c", _HERE / "decode_step.c")
HEADERS = (_HERE / "kernels.h", _HERE / "quant_acts.h", _HERE / "quant_tiles.h", _HERE / "quant_byte_tiles.h")
# NOTE: not -ffast-math: with -shared, GCC 12 links crtfastmath.o, which flushes denormals for the whole
# process on load and would change every torch op's numerics. These flags only let reductions vectorize.
BASE_CFLAGS = ("-O3", "-fopenmp", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math",
               "-fassociative-math", "-fno-signed-zeros", "-freciprocal-math")
# Flag sets of the CPUs the kernels are tested for, besides this machine's own (``native``).
# NOTE: GCC 12 has no -march=znver4; Zen 4 is Zen 3 plus its AVX-512 extensions.
TARGETS: dict[str, tuple[str, ...]] = {
    "native": ("-march=native",),
    "intel-sapphirerapids": ("-march=sapphirerapids",),
    "amd-zen4": ("-march=znver3", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mavx512cd",
                 "-mavx512vnni", "-mavx512bf16", "-mavx512ifma", "-mavx512vbmi", "-mavx512vbmi2",
                 "-mavx512bitalg", "-mavx512vpopcntdq", "-mgfni", "-mvaes", "-mvpclmulqdq"),
    "avx2-no-avx512": ("-march=x86-64-v3",),
    "x86-64-baseline": ("-march=x86-64",),
}


def machine_key() -> str:
    """What the built code depends on besides its source: the machine and this CPU's features."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        cpu = platform.processor()
    return f"{platform.machine()}|{cpu}"


def build_library(compiler: str, out_dir: Path, target: str = "native",
                  sources: tuple[Path, ...] = SOURCES) -> Path:
    """The library built from ``sources`` for ``target`` (a :data:`TARGETS` name), compiled unless cached."""
    cflags = (*BASE_CFLAGS, *TARGETS[target])
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    parts = [*(s.read_text() for s in (*sources, *HEADERS)), " ".join(cflags), version, machine_key()]
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    target_path = out_dir / f"cpu_kernels-{target}-{key}.so"
    if target_path.exists():
        return target_path
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *cflags, *map(str, sources), "-o", tmp, "-lm"], capture_output=True,
                                text=True)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[-800:]}")
        os.replace(tmp, target_path)  # atomic: a concurrent build of the same key writes the same file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target_path
