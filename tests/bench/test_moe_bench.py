"""`mixgate bench engine` on a tiny Mixtral: the MoE table's estimates, positions and the
experts the timed steps actually computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.engine.bench import run_engine_bench
from bench.engine.hardware_rates import fixed_rates_probe
from bench.engine.moe import position_between
from engine.model.config import ModelConfig
from engine.model.make_model import make_model
from mixgate.cli import build_parser
from planning.model_shape_from_config import shape_from_hf_config


def test_position_is_zero_on_active_one_on_union_none_when_they_coincide() -> None:
    assert position_between(10.0, 10.0, 20.0) == 0.0
    assert position_between(20.0, 10.0, 20.0) == 1.0
    assert position_between(25.0, 10.0, 20.0) == 1.5
    assert position_between(12.0, 10.0, 10.2) is None


# Fixed rates instead of this machine's measured ones: with C this large every step is
# memory-bound, so the two estimates part at B > 1 by exactly the extra experts' bytes / BW.
# (Measured rates made the verdict depend on the CPU: on a 2-vCPU EPYC the tiny MoE turned
# compute-bound at B = 6 and the two estimates were equal.)
GIVEN_FLOPS_PER_S = 1e18
GIVEN_BYTES_PER_S = 1e9
CONTEXT_TOKENS = 8


def test_bench_engine_on_moe_reports_both_estimates_and_the_union(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_model(tmp_path / "moe", "tiny-moe", seed=2)
    out = tmp_path / "bench.json"
    argv = ["bench", "engine", "--model", str(folder), "--batch-sizes", "1,6",
            "--throughput-batches", "", "--steps", "2", "--rounds", "1",
            "--context", str(CONTEXT_TOKENS), "--json", str(out)]  # fmt: skip
    probe = fixed_rates_probe(GIVEN_FLOPS_PER_S, GIVEN_BYTES_PER_S)
    assert run_engine_bench(build_parser().parse_args(argv), measure_rates=probe) == 0
    result = json.loads(out.read_text())
    assert (result["C_flops"], result["BW_bytes_s"]) == (GIVEN_FLOPS_PER_S, GIVEN_BYTES_PER_S)
    assert result["rates_source"].startswith("given:")
    config = ModelConfig.from_pretrained(folder)
    model = result["model"]
    # The cost model's count (from config.json) and the engine's agree.
    assert model["num_parameters"] == config.num_parameters()
    assert model["active_parameters"] == config.num_active_parameters()
    experts, top_k = model["num_experts"], model["experts_per_token"]
    assert (experts, top_k) == (config.num_local_experts, config.num_experts_per_tok)
    shape = shape_from_hf_config(json.loads((folder / "config.json").read_text()), 4)
    kv_bytes_per_token = shape.kv_bytes_per_token
    one, six = result["moe"]
    assert (one["batch"], six["batch"]) == (1, 6)
    for row in (one, six):
        batch = row["batch"]
        touched = experts * (1 - (1 - top_k / experts) ** batch)
        assert row["experts_touched_expected"] == pytest.approx(touched, rel=1e-12)
        # One token computes exactly its top-k; a batch at most every expert.
        assert top_k <= row["experts_touched_measured"] <= experts
        # Memory-bound at these rates: (weights read + the batch's KV reads) / BW, where the
        # union reads the dense part and `touched` of the E experts, the active-dense view
        # the dense part and k of them whatever B is.
        kv_bytes = kv_bytes_per_token * batch * CONTEXT_TOKENS
        union_bytes = shape.dense_weight_bytes + shape.expert_weight_bytes * touched / experts
        active_bytes = round(shape.dense_weight_bytes + shape.expert_weight_bytes * top_k / experts)
        assert row["expert_union_s"] == pytest.approx(
            (union_bytes + kv_bytes) / GIVEN_BYTES_PER_S, rel=1e-12
        )
        assert row["active_dense_s"] == pytest.approx(
            (active_bytes + kv_bytes) / GIVEN_BYTES_PER_S, rel=1e-12
        )
        assert row["expert_union_limited_by"] == row["active_dense_limited_by"] == "weights"
        step = next(r for r in result["rows"] if r["batch"] == batch)
        assert row["step_s"] == step["step_s"]
        # The main table's estimate for an MoE model is the expert-union one.
        assert step["estimate_s"] == row["expert_union_s"]
        assert step["ratio"] == pytest.approx(step["step_s"] / step["estimate_s"])
    assert one["experts_touched_measured"] == top_k
    assert one["active_dense_s"] == pytest.approx(one["expert_union_s"], rel=1e-9)
    assert one["position"] is None and one["curve_position"] is None
    # The union reads (touched(6) - k) more experts' bytes per layer than the active view.
    extra_experts = six["experts_touched_expected"] - top_k
    assert extra_experts > 1.9  # 4 * (1 - 0.5**6) - 2 = 1.9375 for the tiny MoE
    assert six["expert_union_s"] - six["active_dense_s"] == pytest.approx(
        shape.expert_weight_bytes * extra_experts / experts / GIVEN_BYTES_PER_S, rel=1e-6
    )
    assert "MoE" in capsys.readouterr().out
