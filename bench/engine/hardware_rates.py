"""This machine's effective arithmetic rate C and weight-streaming bandwidth BW, measured.

C: a square matmul in the model's dtype; every element is reused n times, so it is bound by
arithmetic, not memory. BW: a matrix-vector product, which is what a decode step does with
each weight matrix: every weight is read once and used once. The matrix must be far larger
than the last-level cache, or the number is the cache's speed, not memory's.

Both run through the linear the engine itself runs (`engine.model.prepacked_linear`: oneDNN over a
prepacked weight where the CPU has it, else torch's own; BW the faster of that and the engine's
own few-row loop, `engine.model.kernels.skinny`, where it builds), so that C and BW are the rates
the engine's steps can reach. NOTE: on a 2-vCPU Zen 4 EPYC (2 threads, load ~8, medians of 5):
fp32 n=2048 torch.mm 48 GFLOP/s vs prepacked 102; a 512 MiB fp32 matrix-vector product
F.linear 11.6 GB/s vs prepacked 13.4 (best samples 12.1 vs 27.0).

Both are medians over repeats: on a shared machine a single sample can be off by 2-8x.

A benchmark takes its rates through a `RatesProbe`, so that a test can hand it fixed numbers
(`fixed_rates_probe`): a verdict that depends on this machine's measured speed passes on one
CPU and fails on another.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.huge_pages import copy_into_huge_pages
from engine.model.kernels.skinny import skinny_linear_kernel
from engine.model.prepacked_linear import PrepackedLinear, prepacking_supported
from planning.costmodel import HardwareRates

__all__ = [
    "MeasuredRates",
    "RatesProbe",
    "default_matrix_bytes",
    "engine_linear",
    "fixed_rates_probe",
    "last_level_cache_bytes",
    "measure_hardware_rates",
    "median_rates",
    "median_time_s",
]

_MIB = 1 << 20
# Floor from the issue: below ~256 MiB a matrix can stay resident in a big server L3.
_MIN_MATRIX_BYTES = 256 * _MIB
# Ceiling: a bigger matrix adds allocation time and memory pressure but no accuracy.
_MAX_MATRIX_BYTES = 2048 * _MIB
# Columns of the bandwidth matrix: rows of 16 KiB (fp32) stream as long contiguous runs, as
# the rows of a model's weight matrices do.
_MATRIX_COLS = 4096
_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_SIZE_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True, slots=True)
class MeasuredRates:
    flops_per_s: float  # C: median rate of an n x n x n matmul
    bytes_per_s: float  # BW: median matrix bytes read per second by a matrix-vector product
    matmul_size: int  # n of the matmul
    matrix_bytes: int  # bytes of the bandwidth matrix (read once per product)
    dtype: str
    device: str
    threads: int
    repeats: int  # timed repeats per round
    rounds: int = 1  # measurements this one is the median of (see median_rates)
    given: bool = False  # True: fixed numbers handed in (tests), not measured on this machine

    def hardware(self) -> HardwareRates:
        if self.given:
            return HardwareRates(
                flops_per_s=self.flops_per_s,
                bytes_per_s=self.bytes_per_s,
                source=f"given: C {self.flops_per_s:.6g} FLOP/s, BW {self.bytes_per_s:.6g} B/s",
            )
        return HardwareRates(
            flops_per_s=self.flops_per_s,
            bytes_per_s=self.bytes_per_s,
            source=f"measured: {self.dtype} matmul n={self.matmul_size}, matrix-vector "
            f"{self.matrix_bytes // _MIB} MiB, {self.threads} threads, median of "
            f"{self.rounds} rounds x {self.repeats}",
        )


def _parse_size_bytes(text: str) -> int:
    text = text.strip()
    if text and text[-1].upper() in _SIZE_UNITS:
        return int(text[:-1]) * _SIZE_UNITS[text[-1].upper()]
    return int(text)


def last_level_cache_bytes(cache_dir: Path = _CACHE_DIR) -> int | None:
    """Size of the highest cache level sysfs reports for cpu0, or None where it cannot tell."""
    best: tuple[int, int] | None = None
    for index in cache_dir.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = _parse_size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if best is None or level > best[0]:
            best = (level, size)
    return None if best is None else best[1]


def default_matrix_bytes(device: torch.device) -> int:
    """At least 2x the last-level cache (NOTE: VMs may report the host's whole L3, e.g. 480
    MiB, though this guest only gets a share of it; 2x the reported size is safe either way)."""
    if device.type != "cpu":
        return 1024 * _MIB  # GPU L2 caches are tens of MiB: 1 GiB is far beyond them
    cache = last_level_cache_bytes() or 0
    return min(_MAX_MATRIX_BYTES, max(_MIN_MATRIX_BYTES, 2 * cache))


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time_s(
    fn: Callable[[], object], repeats: int, device: torch.device, warmup: int = 2
) -> float:
    """Median wall time of `fn` after `warmup` untimed calls (first calls pay one-off costs)."""
    for _ in range(warmup):
        fn()
    _synchronize(device)
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        _synchronize(device)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def engine_linear(weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x weight^T through the path the engine's linears take on this device and dtype."""
    if not prepacking_supported(weight.device, weight.dtype):
        return lambda x: F.linear(x, weight)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return PrepackedLinear(linear)


def _matmul_flops_per_s(n: int, dtype: torch.dtype, device: torch.device, repeats: int) -> float:
    a = torch.rand(n, n, dtype=dtype, device=device)
    linear = engine_linear(torch.rand(n, n, dtype=dtype, device=device))
    return 2 * n**3 / median_time_s(lambda: linear(a), repeats, device)


def _matvec_bytes_per_s(
    matrix_bytes: int, dtype: torch.dtype, device: torch.device, repeats: int
) -> tuple[float, int]:
    element_bytes = torch.empty((), dtype=dtype).element_size()
    rows = max(1, matrix_bytes // (element_bytes * _MATRIX_COLS))
    # NOTE: a constant fill is as good as random data for timing (no zeros or denormals, which
    # some kernels shortcut) and is much faster to write than torch.rand over a GiB.
    matrix = torch.full((rows, _MATRIX_COLS), 0.5, dtype=dtype, device=device)
    actual_bytes = matrix.numel() * element_bytes
    # [1, cols] through the engine's linear, the call the model makes for one token; the
    # plain matrix is dropped once packed (a packed copy of it is the one read).
    linear = engine_linear(matrix)
    kernel = skinny_linear_kernel() if device.type == "cpu" and dtype == torch.float32 else None
    # In huge pages, as the engine holds its panels (engine/model/huge_pages.py): 4 KiB pages
    # would slow this stream by their TLB misses and the estimate would flatter the engine.
    panels = None if kernel is None else copy_into_huge_pages([kernel.pack(matrix)])[0]
    del matrix
    x = torch.full((1, _MATRIX_COLS), 0.25, dtype=dtype, device=device)
    elapsed_s = median_time_s(lambda: linear(x), repeats, device)
    if kernel is not None and panels is not None:
        # The engine's own loop streams weights faster than oneDNN where it takes them
        # (engine/model/kernels/skinny.py): BW is the faster of the two, or the estimate would
        # flatter the steps that use it.
        del linear
        kernel_s = median_time_s(lambda: kernel.matmul(x, panels, rows, None), repeats, device)
        elapsed_s = min(elapsed_s, kernel_s)
    return actual_bytes / elapsed_s, actual_bytes


def measure_hardware_rates(
    dtype: torch.dtype,
    device: torch.device,
    *,
    matrix_bytes: int | None = None,
    matmul_size: int | None = None,
    repeats: int = 9,
) -> MeasuredRates:
    """C and BW in `dtype` on `device` with torch's current thread count."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    # 2048^3 x 2 = 17 GFLOP: ~0.1 s per fp32 product on 2 CPU cores; GPUs need a bigger one.
    n = matmul_size or (2048 if device.type == "cpu" else 8192)
    flops_per_s = _matmul_flops_per_s(n, dtype, device, repeats)
    bytes_per_s, actual_bytes = _matvec_bytes_per_s(
        matrix_bytes or default_matrix_bytes(device), dtype, device, repeats
    )
    return MeasuredRates(
        flops_per_s=flops_per_s,
        bytes_per_s=bytes_per_s,
        matmul_size=n,
        matrix_bytes=actual_bytes,
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        threads=torch.get_num_threads(),
        repeats=repeats,
    )


# (dtype, device, bandwidth matrix bytes or None for the default) -> one round's rates.
RatesProbe = Callable[[torch.dtype, torch.device, int | None], MeasuredRates]


def fixed_rates_probe(flops_per_s: float, bytes_per_s: float) -> RatesProbe:
    """A probe that measures nothing and returns these rates every round."""

    def probe(dtype: torch.dtype, device: torch.device, matrix_bytes: int | None) -> MeasuredRates:
        return MeasuredRates(
            flops_per_s=flops_per_s,
            bytes_per_s=bytes_per_s,
            matmul_size=0,
            matrix_bytes=0,
            dtype=str(dtype).removeprefix("torch."),
            device=str(device),
            threads=torch.get_num_threads(),
            repeats=0,
            given=True,
        )

    return probe


def median_rates(rounds: list[MeasuredRates]) -> MeasuredRates:
    """Each rate's median over rounds measured at different times (load comes in bursts)."""
    if not rounds:
        raise ValueError("at least one measurement is needed")
    return replace(
        rounds[0],
        flops_per_s=statistics.median(r.flops_per_s for r in rounds),
        bytes_per_s=statistics.median(r.bytes_per_s for r in rounds),
        rounds=sum(r.rounds for r in rounds),
    )
