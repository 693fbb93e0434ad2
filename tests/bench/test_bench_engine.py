"""`mixgate bench engine` end to end on the tiny model, and the naive baseline's parity with
the engine (the throughput comparison is only fair if both compute the same tokens)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.engine.bench import mixed_workload, run_engine_requests
from bench.engine.hardware_rates import MeasuredRates, last_level_cache_bytes, median_rates
from bench.engine.naive_baseline import BenchRequest, run_naive
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from mixgate.cli import main

ROW_NUMBERS = ("step_s", "estimate_s", "compute_s", "memory_s", "ratio")
MODEL_COUNTS = ("num_parameters", "weight_bytes", "kv_bytes_per_token", "num_hidden_layers")


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_bench_engine_writes_every_field(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    argv = ["bench", "engine", "--model", str(tiny_model_dir), "--batch-sizes", "1,2",
            "--throughput-batches", "2", "--steps", "2", "--rounds", "2", "--context", "16",
            "--bandwidth-matrix-mb", "8", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert _positive(result["C_flops"]) and _positive(result["BW_bytes_s"])
    assert len(result["C_flops_rounds"]) == len(result["BW_bytes_s_rounds"]) == 2
    assert all(_positive(result["model"][key]) for key in MODEL_COUNTS)
    assert result["threads"] >= 1 and result["torch"] == torch.__version__
    config = result["config"]
    assert (config["model_dir"], config["context"], config["steps"]) == (str(tiny_model_dir), 16, 2)
    assert {"dtype", "seed", "git_revision"} <= config.keys()
    assert [row["batch"] for row in result["rows"]] == [1, 2]
    for row in result["rows"]:
        assert all(_positive(row[key]) for key in ROW_NUMBERS), row
        assert row["limiting"] in ("compute", "weights", "kv")
        assert row["ratio"] == pytest.approx(row["step_s"] / row["estimate_s"])
    one, two = result["rows"]
    # Throughput is only run for the throughput batch sizes.
    assert one["tokens_s"] is None and one["baseline_tokens_s"] is None
    assert _positive(two["tokens_s"]) and _positive(two["baseline_tokens_s"])
    (comparison,) = result["throughput"]
    assert comparison["requests"] == 8 and comparison["same_tokens_fraction"] == 1.0
    assert "engine" in capsys.readouterr().out  # the table was printed


def _engine(model_dir: Path, max_active_seqs: int) -> LLMEngine:
    config = EngineConfig(max_active_seqs=max_active_seqs, step_token_budget=256, device="cpu")
    return LLMEngine(model_dir, config)


def test_naive_baseline_greedy_tokens_equal_the_engines(tiny_model_dir: Path) -> None:
    rng = random.Random(7)
    # Prompt lengths far apart, so the padded batches carry lots of padding; output lengths
    # far apart, so some rows keep running after their request is done.
    requests = [
        BenchRequest(f"r{i}", tuple(rng.randrange(259) for _ in range(length)), max_tokens)
        for i, (length, max_tokens) in enumerate([(3, 12), (41, 5), (17, 20), (9, 1), (30, 9)])
    ]
    engine = _engine(tiny_model_dir, max_active_seqs=2)
    engine_tokens, _ = run_engine_requests(engine, requests)
    naive = run_naive(engine.runner.model, requests, batch_size=3)  # batches of 3 and 2
    for request in requests:
        assert len(naive.tokens[request.request_id]) == request.max_tokens
        assert naive.tokens[request.request_id] == engine_tokens[request.request_id], request
    # Guard against a vacuous match: the outputs must actually vary.
    assert len({t for tokens in naive.tokens.values() for t in tokens}) > 3
    assert naive.padded_prompt_tokens == 3 * 41 + 2 * 30
    assert naive.decode_steps == (20 - 1) + (9 - 1)


def test_mixed_workload_is_seeded_and_in_range() -> None:
    first = mixed_workload(50, 259, random.Random("s"))
    assert first == mixed_workload(50, 259, random.Random("s"))
    assert all(16 <= len(r.prompt_token_ids) <= 256 and 8 <= r.max_tokens <= 128 for r in first)
    assert len({r.request_id for r in first}) == 50


def test_last_level_cache_is_the_highest_level(tmp_path: Path) -> None:
    for index, (level, size) in enumerate([("1", "48K"), ("3", "491520K"), ("2", "2048K")]):
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(level + "\n")
        (folder / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 491520 * 1024
    assert last_level_cache_bytes(tmp_path / "missing") is None


def test_median_rates_takes_each_rate_median() -> None:
    def rates(flops: float, bytes_per_s: float) -> MeasuredRates:
        return MeasuredRates(flops, bytes_per_s, 64, 1 << 20, "float32", "cpu", 2, 5)

    combined = median_rates([rates(1e9, 5e9), rates(3e9, 1e9), rates(2e9, 9e9)])
    assert (combined.flops_per_s, combined.bytes_per_s, combined.rounds) == (2e9, 5e9, 3)
    assert "3 rounds" in combined.hardware().source
    with pytest.raises(ValueError):
        median_rates([])
