"""What a simulation runs on: the model's config.json, its cost-model shape, the device's
rates and memory, and the KV block pool that memory leaves.

`--model` is a folder with a config.json, a config.json file, an engine preset (`tiny`,
`small`, `100m`) or a config shipped in bench/configs (`llama-3-70b`). `--device` is a preset
name (`h100`, `h200`, ...) or `measured[:FILE]` (rates calibrated on this machine).
`--devices N` is tensor parallelism taken as ideal scaling: N times the arithmetic rate, the
bandwidth and the memory, no communication cost. That is optimistic, and said so in every
run's config.json.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from engine.model.presets import PRESET_NAMES, get_preset
from engine.text.tokenizer_builder import BYTE_VOCAB_SIZE
from planning.calibration_file import resolve_device
from planning.costmodel import HardwareRates, ModelShape
from planning.memory_budget import MemoryBudget
from planning.model_shape_from_config import shape_from_hf_config
from planning.plan_command import DTYPE_BYTES
from planning.plan_command import load_model_config as planning_model_config

__all__ = ["SimTarget", "load_model_config", "resolve_target"]

# A preset's config as the simulator reads it (bf16 weights; EOS past the byte vocabulary, so
# the simulated tokens never end a sequence early).
_SIM_PRESETS = {
    name: partial(
        get_preset(name).to_config_dict,
        dtype="bfloat16",
        eos_token_id=BYTE_VOCAB_SIZE,
        pad_token_id=None,
    )
    for name in PRESET_NAMES
}


def load_model_config(model: str) -> tuple[str, dict[str, Any]]:
    """(a name, the raw config.json dict) for a folder, a file, a preset or a shipped config
    (`mixgate plan`'s resolution, planning.plan_command.load_model_config)."""
    path = Path(model)
    name = path.stem if path.is_file() else path.name if path.is_dir() else model
    return name, planning_model_config(model, _SIM_PRESETS)


@dataclass(frozen=True, slots=True)
class SimTarget:
    model_name: str
    raw_config: dict[str, Any]
    shape: ModelShape
    hardware: HardwareRates  # already times `devices`
    device: str
    devices: int
    dtype: str
    memory_bytes: int  # all devices together

    def memory_budget(self, step_token_budget: int) -> MemoryBudget:
        """Weights, the largest step's activations and a tenth of headroom come off first."""
        return MemoryBudget.with_headroom_fraction(
            self.memory_bytes,
            self.shape.weight_bytes,
            self.shape.kv_bytes_per_token,
            activation_bytes=self.shape.activation_bytes_per_token * step_token_budget,
        )

    def num_kv_blocks(self, block_size_tokens: int, step_token_budget: int) -> int:
        capacity = self.memory_budget(step_token_budget).kv_token_capacity()
        if capacity < block_size_tokens:
            raise ValueError(
                f"{self.model_name} ({self.shape.weight_bytes / 1e9:.1f} GB of weights) leaves "
                f"no KV cache in {self.memory_bytes / 1e9:.1f} GB: use more --devices"
            )
        return capacity // block_size_tokens

    def describe(self, step_token_budget: int) -> dict[str, Any]:
        """For config.json: what was simulated, and the assumptions behind it."""
        return {
            "model": self.model_name,
            "device": self.device,
            "devices": self.devices,
            "dtype": self.dtype,
            "hardware": asdict(self.hardware),
            "shape": asdict(self.shape),
            "memory_bytes": self.memory_bytes,
            "kv_token_capacity": self.memory_budget(step_token_budget).kv_token_capacity(),
            "scaling": (
                f"{self.devices} device(s) as ideal tensor parallelism: compute, bandwidth and "
                "memory times the device count, no communication cost"
            ),
            "step_time": "planning.costmodel.mixed_step_estimate_s (an estimate, not measured)",
        }


def resolve_target(model: str, device: str, *, devices: int = 1, dtype: str = "bf16") -> SimTarget:
    """Model + device (+ count) -> what the simulator needs."""
    if devices < 1:
        raise ValueError(f"--devices must be at least 1, got {devices}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"--dtype {dtype!r}: one of {sorted(DTYPE_BYTES)}")
    name, raw = load_model_config(model)
    shape = shape_from_hf_config(raw, DTYPE_BYTES[dtype])
    one = resolve_device(device)
    scaled = f"; x{devices} devices, ideal scaling" if devices > 1 else ""
    hw = replace(
        one.rates,
        flops_per_s=one.rates.flops_per_s * devices,
        bytes_per_s=one.rates.bytes_per_s * devices,
        source=one.rates.source + scaled,
    )
    return SimTarget(name, raw, shape, hw, one.name, devices, dtype, one.memory_bytes * devices)
