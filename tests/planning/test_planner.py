"""The planner: rows per batch size, the best B by hand, the starting envelope, the CLI."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from mixgate.cli import main
from planning.costmodel import HardwareRates, ModelShape
from planning.device_presets import Device
from planning.planner import default_batch_sizes, make_plan, starting_envelope
from policies.envelope import load_envelope

# P = 1e9, W = 2e9 bytes, 1e5 KV bytes per token; C = 1e14, BW = 1e12 (test_costmodel.py).
# Per decode at context 100: compute 2e-5 s, cache read 1e-5 s; weights 2e-3 s per step.
SHAPE = ModelShape(
    num_parameters=1_000_000_000, weight_bytes=2_000_000_000, kv_bytes_per_token=100_000
)
RATES = HardwareRates(flops_per_s=1e14, bytes_per_s=1e12, source="test")
# 12e9 bytes, a tenth of it headroom: 10.8e9 - 2e9 of weights = 8.8e9 for KV = 88 000 tokens
# = 880 sequences of 100 tokens.
DEVICE = Device("test-gpu", RATES, memory_bytes=12_000_000_000)


def test_best_batch_is_limited_by_the_itl_target_worked_by_hand() -> None:
    # ITL 10 ms. Memory-bound until B = 200 (test_costmodel.py), then 2e-5 · B s: B = 500
    # gives exactly 10 ms, so 500 is the largest B within target; 880 fit in memory.
    plan = make_plan(SHAPE, DEVICE, context_tokens=100, itl_slo_s=0.010)
    assert plan.max_sequences_in_memory == 880
    assert plan.max_batch_for_itl == 500
    assert plan.best_batch_size == 500
    assert plan.crossover_batch_size == pytest.approx(200)
    by_batch = {row.batch_size: row for row in plan.rows}
    assert by_batch[1].limited_by == "weights"
    assert by_batch[256].limited_by == "compute"
    assert by_batch[512].meets_itl is False and by_batch[256].meets_itl is True
    assert by_batch[1024].fits_memory is False
    assert by_batch[8].memory_used_bytes == 2_000_000_000 + 8 * 100 * 100_000


def test_best_batch_is_limited_by_memory_when_the_target_is_loose() -> None:
    plan = make_plan(SHAPE, DEVICE, context_tokens=100, itl_slo_s=1.0)
    assert plan.max_batch_for_itl > plan.max_sequences_in_memory == plan.best_batch_size == 880


def test_nothing_meets_an_impossible_target() -> None:
    plan = make_plan(SHAPE, DEVICE, context_tokens=100, itl_slo_s=1e-3)  # weights alone: 2 ms
    assert plan.best_batch_size is None and plan.max_batch_for_itl == 0
    with pytest.raises(ValueError):
        starting_envelope(SHAPE, plan)


def test_starting_envelope_is_valid_and_keeps_itl_with_a_prompt_chunk() -> None:
    plan = make_plan(SHAPE, DEVICE, context_tokens=100, itl_slo_s=0.010)
    env = starting_envelope(SHAPE, plan, created_at="2025-01-01T00:00:00+00:00")
    # The plan's B is what runs at most: bulk's slots and the interactive ones on top.
    assert env.max_active_seqs + env.interactive_reserved_seqs == 500
    assert env.interactive_reserved_seqs == 4
    # 500 tokens of a step already take the whole 10 ms (compute-bound): no room for a chunk.
    assert env.step_token_budget == 500
    assert env.interactive_limits.max_context_tokens == 100
    assert env.provenance.source == "planner"
    assert env.provenance.slo == {"itl_s": 0.010}
    # A smaller batch leaves room: at B = 100, a step of T tokens costs max(2e-5·T, ...)
    # -> T = 500 tokens fit in 10 ms.
    smaller = make_plan(SHAPE, DEVICE, context_tokens=100, itl_slo_s=0.010, batch_sizes=(100,))
    assert smaller.best_batch_size == 500  # the best B does not depend on the rows shown
    assert default_batch_sizes(8) == (1, 2, 4, 8)


def test_plan_cli_for_llama_3_8b_on_h100(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "envelope.toml"
    plan_json = tmp_path / "plan.json"
    code = main(["plan", "--model", "llama-3-8b", "--device", "h100", "--context", "4096",
                 "--itl-slo-ms", "50", "--out", str(out), "--json", str(plan_json)])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    # Memory-bound on weights at small B, on the KV cache at large B (long context).
    assert "weights" in printed and "kv" in printed
    env = load_envelope(out.read_text())
    assert 1 <= env.max_active_seqs <= 128
    assert env.step_token_budget >= env.max_active_seqs
    assert tomllib.loads(out.read_text())["provenance"]["source"] == "planner"
    rows = json.loads(plan_json.read_text())["rows"]
    assert {row["limited_by"] for row in rows} == {"weights", "kv"}


def test_plan_cli_for_mixtral_shows_the_union(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--model", "mixtral-8x7b", "--device", "h200", "--context", "1024",
                 "--batch-sizes", "1,4,64"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    assert "2.00/8" in printed  # one token reads its two experts
    assert "8.00/8" in printed  # 64 tokens read all eight
    assert "as dense" in printed


def test_plan_cli_refuses_an_unknown_model() -> None:
    with pytest.raises(ValueError, match="not a folder"):
        main(["plan", "--model", "no-such-model", "--device", "h100"])
