"""bench.engine.step_bound: the floors it prints are built from the parts it measured, and its
estimate is the cost model's at the rates it was given (no verdict on this CPU's speed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.engine.hardware_rates import fixed_rates_probe
from bench.engine.step_bound import build_parser, kv_bytes, linear_shapes, run_step_bound
from engine.model.config import ModelConfig
from engine.model.kernels.paged_decode import paged_decode_kernel
from engine.model.kernels.skinny import skinny_linear_kernel
from planning.costmodel import decode_step_estimate_s
from planning.model_shape_from_config import shape_from_hf_config

C_FLOPS, BW_BYTES_S = 2.0e11, 3.0e10

pytestmark = pytest.mark.skipif(
    skinny_linear_kernel() is None or paged_decode_kernel() is None,
    reason="the engine's C kernels need a C compiler",
)


def _run(model_dir: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "bound.json"
    args = build_parser().parse_args(
        [
            "--model", str(model_dir), "--threads", "2", "--batch-sizes", "2,5",
            "--context", "40", "--repeats", "1", "--json", str(out),
        ]
    )  # fmt: skip
    assert run_step_bound(args, measure_rates=fixed_rates_probe(C_FLOPS, BW_BYTES_S)) == 0
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_the_floors_are_built_from_the_measured_parts(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = _run(tiny_model_dir, tmp_path)
    raw = json.loads((tiny_model_dir / "config.json").read_text())
    config = ModelConfig.from_dict(raw)
    model_shape = shape_from_hf_config(raw, 4)
    hardware = fixed_rates_probe(C_FLOPS, BW_BYTES_S)(
        torch.float32, torch.device("cpu"), None
    ).hardware()

    assert result["rates_given"] is True
    assert [row["batch"] for row in result["rows"]] == [2, 5]
    for row in result["rows"]:
        lin, attn = row["linears_ms"], row["attention_ms"]
        assert set(lin) == set(attn) == {"all_threads", "one_thread"}
        assert set(row["side_by_side_ms"]) == {"linears", "attention", "wall"}
        assert all(v > 0 for part in (lin, attn, row["side_by_side_ms"]) for v in part.values())
        assert row["serial_ms"] == pytest.approx(lin["all_threads"] + attn["all_threads"])
        assert row["overlap_floor_ms"] == pytest.approx(
            (lin["one_thread"] + attn["one_thread"]) / 2
        )
        estimate = decode_step_estimate_s(model_shape, hardware, row["batch"], 40)
        assert row["estimate_ms"] == pytest.approx(estimate.step_s * 1e3)
        assert row["serial_ratio"] == pytest.approx(row["serial_ms"] / row["estimate_ms"])
        assert row["overlap_floor_ratio"] == pytest.approx(
            row["overlap_floor_ms"] / row["estimate_ms"]
        )
        # 2 layers x rows x 40 keys x K and V of 2 heads x 16 dims in fp32
        read_bytes = 2 * row["batch"] * 40 * 2 * 2 * 16 * 4
        assert read_bytes == kv_bytes(config, row["batch"], 40)
        assert row["attention_gb_per_s"]["one_thread"] == pytest.approx(
            read_bytes / (attn["one_thread"] / 1e3) / 1e9
        )


def test_the_linears_are_the_engines_fused_ones() -> None:
    config = ModelConfig.from_dict(
        {
            "num_hidden_layers": 12, "hidden_size": 768, "intermediate_size": 3072,
            "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
            "vocab_size": 259,
        }
    )  # fmt: skip
    # qkv: 12 query heads + K and V of 4 heads, 64 dims each; gate and up in one.
    assert linear_shapes(config) == [(1280, 768), (768, 768), (6144, 768), (768, 3072)]
