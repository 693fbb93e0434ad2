"""Accelerators the planner knows by name: datasheet peaks and a default effective fraction.

The cost model wants *effective* rates: what kernels reach, not the datasheet peak. Without a
measurement, a fixed fraction of the peak stands in (large bf16 GEMMs reach roughly 60-75% of
Hopper's dense peak; decode-shaped streaming reaches roughly 75-90% of HBM bandwidth). Measured
rates (``mixgate plan calibrate``, device ``measured``) replace both; the calibration file is
read in ``planning.calibration_file`` (I/O stays out of policies/) and handed to
``device_from_mapping``.

Peaks are dense (no 2:4 sparsity) bf16 tensor-core flop/s; memory is what CUDA reports as
total memory (a little under the marketing "80 GB"/"141 GB").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from planning.costmodel import HardwareRates

__all__ = [
    "DEVICE_PRESETS",
    "Device",
    "DevicePreset",
    "device",
    "device_from_mapping",
    "device_rates",
]

_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class DevicePreset:
    name: str
    peak_flops_per_s: float  # dense bf16 tensor-core peak
    peak_bytes_per_s: float  # memory (HBM/GDDR) bandwidth peak
    memory_bytes: int
    source: str  # where the peaks come from
    effective_flops_fraction: float = 0.7
    effective_bytes_fraction: float = 0.8

    def __post_init__(self) -> None:
        if min(self.peak_flops_per_s, self.peak_bytes_per_s, self.memory_bytes) <= 0:
            raise ValueError("peaks and memory must be positive")
        for fraction in (self.effective_flops_fraction, self.effective_bytes_fraction):
            if not 0.0 < fraction <= 1.0:
                raise ValueError("effective fractions must be in (0, 1]")


@dataclass(frozen=True, slots=True)
class Device:
    """What the planner needs of a device: rates for the cost model, memory for the budget."""

    name: str
    rates: HardwareRates
    memory_bytes: int

    def __post_init__(self) -> None:
        if not self.name or self.memory_bytes < 1:
            raise ValueError("a device needs a name and positive memory_bytes")


_ALL = (
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity, so 989.5
    # dense; 80 GB HBM3 at 3.35 TB/s. https://www.nvidia.com/en-us/data-center/h100/
    DevicePreset("h100", 989.5e12, 3.35e12, int(79.6 * _GIB), "NVIDIA H100 SXM5 datasheet"),
    # NVIDIA H200 datasheet (SXM): same Hopper compute (BF16 1,979 TFLOPS sparse, 989.5
    # dense); 141 GB HBM3e at 4.8 TB/s. https://www.nvidia.com/en-us/data-center/h200/
    DevicePreset("h200", 989.5e12, 4.8e12, int(139.8 * _GIB), "NVIDIA H200 SXM datasheet"),
    # NVIDIA A100 datasheet (80GB SXM): BF16 312 TFLOPS dense (624 sparse); HBM2e at
    # 2,039 GB/s. https://www.nvidia.com/en-us/data-center/a100/
    DevicePreset("a100-80gb", 312e12, 2.039e12, int(79.2 * _GIB), "NVIDIA A100 80GB datasheet"),
    # NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity, so 121 dense; 24 GB GDDR6 at
    # 300 GB/s. https://www.nvidia.com/en-us/data-center/l4/
    DevicePreset("l4", 121e12, 300e9, int(22.5 * _GIB), "NVIDIA L4 datasheet"),
)

DEVICE_PRESETS: Mapping[str, DevicePreset] = MappingProxyType({p.name: p for p in _ALL})
# Spellings people type for the same devices.
_ALIASES = {"h100-sxm": "h100", "h100sxm": "h100", "a100": "a100-80gb", "a100-80g": "a100-80gb"}


def _preset(name: str) -> DevicePreset:
    key = _ALIASES.get(name.lower(), name.lower())
    try:
        return DEVICE_PRESETS[key]
    except KeyError:
        known = ", ".join((*DEVICE_PRESETS, "measured[:FILE]"))
        raise ValueError(f"unknown device {name!r}; choose one of {known}") from None


def device_rates(name: str, effective_fraction: float | None = None) -> HardwareRates:
    """Effective rates of a preset: its default fractions of the peaks, or
    ``effective_fraction`` of both when given."""
    preset = _preset(name)
    if effective_fraction is not None and not 0.0 < effective_fraction <= 1.0:
        raise ValueError("effective_fraction must be in (0, 1]")
    flops_fraction = effective_fraction or preset.effective_flops_fraction
    bytes_fraction = effective_fraction or preset.effective_bytes_fraction
    return HardwareRates(
        flops_per_s=preset.peak_flops_per_s * flops_fraction,
        bytes_per_s=preset.peak_bytes_per_s * bytes_fraction,
        source=f"{preset.source}: peak x{flops_fraction:g} compute, x{bytes_fraction:g} bandwidth",
    )


def device(name: str, effective_fraction: float | None = None) -> Device:
    """A preset as a ``Device`` (rates and memory)."""
    preset = _preset(name)
    return Device(preset.name, device_rates(name, effective_fraction), preset.memory_bytes)


def device_from_mapping(data: Mapping[str, object], name: str = "measured") -> Device:
    """A measured device from a calibration file's content: ``HardwareRates.from_mapping``
    keys plus ``memory_bytes``."""
    memory = data.get("memory_bytes")
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
        raise ValueError(f"memory_bytes must be a positive integer, got {memory!r}")
    return Device(name, HardwareRates.from_mapping(data), memory)
