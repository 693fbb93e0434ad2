"""The calibration file `mixgate plan calibrate` writes, and the one way everything reads it.

TOML, top-level keys: the fitted rates (``flops_per_s``, ``bytes_per_s``, ``step_overhead_s``,
``compute_memory_overlap``: ``HardwareRates.from_mapping`` reads them), ``memory_bytes``,
``source``, and what they were measured on (``device_name``, ``threads``, ``dtype``,
``created_at``, ``model``, ...); ``[microbenchmark]`` holds the isolated matmul/matrix-vector
rates, ``[rows.NN]`` each timed step of the fit with its estimate and ratio.

`mixgate plan --device measured[:FILE]` and the simulated executor load it through
``load_rates`` / ``load_device`` / ``resolve_device``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from planning.costmodel import HardwareRates
from planning.device_presets import Device, device, device_from_mapping
from policies.toml_writer import dump_toml

__all__ = [
    "DEFAULT_CALIBRATION_PATH",
    "load_calibration",
    "load_device",
    "load_rates",
    "resolve_device",
    "write_calibration",
]

# data/ is gitignored: a calibration belongs to one machine, not to the repository.
DEFAULT_CALIBRATION_PATH = Path("data/calibration.toml")
MEASURED = "measured"


def load_calibration(path: str | Path = DEFAULT_CALIBRATION_PATH) -> dict[str, object]:
    """The file's content; a missing file says how to make one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no calibration file at {path}: run `mixgate plan calibrate --out {path}` first"
        )
    with path.open("rb") as handle:
        return tomllib.load(handle)


def load_rates(path: str | Path = DEFAULT_CALIBRATION_PATH) -> HardwareRates:
    """The fitted rates (C, BW, per-step overhead, overlap) of a calibration file."""
    return HardwareRates.from_mapping(load_calibration(path))


def load_device(path: str | Path = DEFAULT_CALIBRATION_PATH) -> Device:
    """Rates and memory of a calibration file, as the planner's ``Device``."""
    return device_from_mapping(load_calibration(path), name=f"{MEASURED}:{path}")


def resolve_device(spec: str, effective_fraction: float | None = None) -> Device:
    """``h100``/``h200``/``a100-80gb``/``l4`` (presets), ``measured`` (the default calibration
    file) or ``measured:FILE``. ``effective_fraction`` applies to presets only."""
    name, _, path = spec.partition(":")
    if name == MEASURED:
        return load_device(path or DEFAULT_CALIBRATION_PATH)
    return device(spec, effective_fraction)


def write_calibration(path: str | Path, content: Mapping[str, object]) -> Path:
    """Write ``content`` as TOML (creating the folder); it must carry the rates' keys."""
    HardwareRates.from_mapping(content)  # refuse to write a file load_rates would reject
    device_from_mapping(content)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_toml(content))
    return path
