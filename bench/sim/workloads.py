"""Workloads for simulated runs: the builtins and TOML files, plus the GPU-scale scenarios
shipped as bench/workloads/gpu-*.toml (too heavy for a live CPU run, so not builtins there)."""

from __future__ import annotations

from pathlib import Path

from bench.load.workload import BUILTIN_WORKLOADS, Workload, load_workload, parse_workload

__all__ = ["GPU_WORKLOADS", "load_sim_workload"]

_WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"
GPU_WORKLOADS = tuple(sorted(p.stem for p in _WORKLOADS_DIR.glob("gpu-*.toml")))


def load_sim_workload(name_or_path: str | Path) -> Workload:
    """A builtin, a gpu-* scenario by name, or a TOML file by path."""
    name = str(name_or_path)
    if name in GPU_WORKLOADS and name not in BUILTIN_WORKLOADS:
        return parse_workload((_WORKLOADS_DIR / f"{name}.toml").read_text(encoding="utf-8"))
    return load_workload(name_or_path)
