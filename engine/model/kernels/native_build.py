"""Compiles one of the engine's C kernels into a shared library on first use, cached on disk.

NOTE: built on the machine that runs it, with `-march=native`, because the kernels' speed is
the CPU's vector width (AVX-512 here, AVX2 elsewhere) and a wheel built for the oldest CPU
would run at half of it. A plain C file needs no torch headers: it compiles in about a second,
where a torch C++ extension takes a minute. The library links the process's OpenMP runtime
(torch's own `libgomp.so.1`, already loaded), so its threads are torch's threads, not a second
pool spinning beside them. The cache key covers the source, the flags, the compiler and the
CPU, and a library is written under a temporary name and renamed, so processes that start at
once never load a half-written file.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import structlog

__all__ = ["KernelBuildError", "kernel_cache_dir", "load_kernel"]

# -ffast-math lets gcc vectorize expf and reassociate the dot products; it is given to the
# compile step only, never to the link: linked with it, gcc adds crtfastmath.o, whose
# constructor would flush denormals to zero for the whole process (torch included).
COMPILE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11")
LINK_FLAGS = ("-shared", "-fopenmp")
# Libraries after the object: libm and libmvec (the vectorized expf that -ffast-math calls).
LINK_LIBRARIES = ("-lm", "-lmvec")
COMPILE_TIMEOUT_S = 120.0


log = structlog.get_logger("mixgate.kernels")


class KernelBuildError(RuntimeError):
    """No C compiler, or the kernel did not compile here."""


def kernel_cache_dir() -> Path:
    """Where compiled kernels live: MIXGATE_KERNEL_CACHE, else the user's cache folder."""
    configured = os.environ.get("MIXGATE_KERNEL_CACHE")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mixgate" / "kernels"


def _compiler() -> str:
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise KernelBuildError("no C compiler (gcc) on PATH")
    return compiler


def _cpu_identity() -> str:
    # -march=native compiles for this CPU's features: a cache shared by two CPUs (a home
    # folder on NFS, a copied image) must not hand one CPU the other's instructions.
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def _compiler_version(compiler: str) -> str:
    # Once per compiler and process: every kernel's cache key needs it, and each run of
    # `gcc --version` is a process start on the engine's start-up path.
    try:
        return subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise KernelBuildError(f"could not run {compiler}: {error}") from error


def _cache_key(source: bytes, compiler: str) -> str:
    version = _compiler_version(compiler)
    digest = hashlib.sha256()
    flags = " ".join(COMPILE_FLAGS + LINK_FLAGS + LINK_LIBRARIES)
    for part in (source, flags.encode(), version.encode()):
        digest.update(part)
    digest.update(_cpu_identity().encode())
    return digest.hexdigest()[:20]


def _run(command: list[str]) -> None:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise KernelBuildError(f"{command[0]} failed to run: {error}") from error
    if done.returncode != 0:
        raise KernelBuildError(f"{' '.join(command)} failed: {done.stderr.strip()[:2000]}")


def _build(source_path: Path, target: Path, compiler: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
            obj = Path(scratch) / "kernel.o"
            lib = Path(scratch) / target.name
            _run([compiler, *COMPILE_FLAGS, "-c", str(source_path), "-o", str(obj)])
            _run([compiler, *LINK_FLAGS, str(obj), *LINK_LIBRARIES, "-o", str(lib)])
            os.replace(lib, target)  # atomic: a concurrent loader sees no file or the whole one
    except OSError as error:
        # A read-only or full cache folder: the engine falls back rather than fail to start.
        raise KernelBuildError(f"could not write {target}: {error}") from error


def load_kernel(source_path: Path) -> ctypes.CDLL:
    """The compiled library of `source_path` (built now if this machine has none cached)."""
    # NOTE: torch first, so that its libgomp.so.1 is the OpenMP runtime the library binds to.
    import torch  # noqa: F401

    compiler = _compiler()
    source = source_path.read_bytes()
    target = kernel_cache_dir() / f"{source_path.stem}-{_cache_key(source, compiler)}.so"
    if not target.exists():
        _build(source_path, target, compiler)
    try:
        return ctypes.CDLL(str(target))
    except OSError as error:
        raise KernelBuildError(f"could not load {target}: {error}") from error


def load_kernel_or_none(source_path: Path, unavailable_event: str) -> ctypes.CDLL | None:
    """`load_kernel`, or None where the kernel cannot be built or loaded here, logged as
    `unavailable_event` with the reason: the caller then keeps its torch path."""
    try:
        return load_kernel(source_path)
    except KernelBuildError as error:
        log.warning(unavailable_event, reason=str(error)[:500])
        return None
