"""`mixgate bench engine` on a tiny Mixtral: the MoE table's estimates, positions and the
experts the timed steps actually computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine_bench_moe import position_between
from engine.make_model import make_model
from engine.model_config import ModelConfig
from mixgate.cli import main


def test_position_is_zero_on_active_one_on_union_none_when_they_coincide() -> None:
    assert position_between(10.0, 10.0, 20.0) == 0.0
    assert position_between(20.0, 10.0, 20.0) == 1.0
    assert position_between(25.0, 10.0, 20.0) == 1.5
    assert position_between(12.0, 10.0, 10.2) is None


def test_bench_engine_on_moe_reports_both_estimates_and_the_union(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_model(tmp_path / "moe", "tiny-moe", seed=2)
    out = tmp_path / "bench.json"
    argv = ["bench", "engine", "--model", str(folder), "--batch-sizes", "1,6",
            "--throughput-batches", "", "--steps", "2", "--rounds", "1", "--context", "8",
            "--bandwidth-matrix-mb", "8", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads(out.read_text())
    config = ModelConfig.from_pretrained(folder)
    model = result["model"]
    # The cost model's count (from config.json) and the engine's agree.
    assert model["num_parameters"] == config.num_parameters()
    assert model["active_parameters"] == config.num_active_parameters()
    experts, top_k = model["num_experts"], model["experts_per_token"]
    assert (experts, top_k) == (config.num_local_experts, config.num_experts_per_tok)
    one, six = result["moe"]
    assert (one["batch"], six["batch"]) == (1, 6)
    for row in (one, six):
        batch = row["batch"]
        expected = experts * (1 - (1 - top_k / experts) ** batch)
        assert row["experts_touched_expected"] == pytest.approx(expected)
        # One token computes exactly its top-k; a batch at most every expert.
        assert top_k <= row["experts_touched_measured"] <= experts
        assert 0 < row["active_dense_s"] <= row["expert_union_s"]
        step = next(r for r in result["rows"] if r["batch"] == batch)
        assert row["step_s"] == step["step_s"]
        # The main table's estimate for an MoE model is the expert-union one.
        assert step["estimate_s"] == pytest.approx(row["expert_union_s"])
    assert one["experts_touched_measured"] == top_k
    assert one["active_dense_s"] == pytest.approx(one["expert_union_s"])
    assert one["position"] is None and one["curve_position"] is None
    assert six["expert_union_s"] > six["active_dense_s"]
    assert "MoE" in capsys.readouterr().out
