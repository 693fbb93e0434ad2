"""The mixed-step benchmark and vllm_throughput's prefill mode run and report what they claim."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.baselines import vllm_throughput
from bench.engine.mixed import build_parser, run_mixed_step_bench


def _run_tiny_mixed_step_bench(model_dir: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """The bench on small shapes of the tiny model, with `extra` arguments; its JSON."""
    out = tmp_path / "mixed.json"
    args = build_parser().parse_args(
        [
            "--model", str(model_dir), "--threads", "1", "--decodes", "5",
            "--context-range", "10,70", "--chunk-tokens", "24", "--chunk-start", "40",
            "--rounds", "2", "--repeats", "1", "--json", str(out), *extra,
        ]
    )  # fmt: skip
    assert run_mixed_step_bench(args) == 0
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_mixed_step_bench_times_each_part_and_splits_the_mixed_step(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = _run_tiny_mixed_step_bench(tiny_model_dir, tmp_path, "--profile")
    steps = {row["step"]: row for row in result["rows"]}
    assert set(steps) == {"mixed", "decodes only", "chunk only"}
    assert steps["mixed"]["shape"]["decodes"] == 5
    assert steps["chunk only"]["shape"]["decodes"] == 0
    assert steps["decodes only"]["shape"]["prefill_chunk_tokens"] == 0
    assert all(row["step_ms"] > 0 for row in steps.values())
    shares = result["profile_ms"]
    # Every part was seen by the profiler: the ranges wrap the code that runs. The engine's
    # choice here (gcc installed) is both paged kernels, so nothing goes through SDPA or a
    # gathered copy.
    for part in (
        "attention: paged decode kernel",
        "attention: paged prefill kernel",
        "linears (qkv, o, mlp, lm_head)",
    ):
        assert shares[part] > 0, part
    assert shares["attention: SDPA"] == 0
    assert shares["attention: K/V gather"] == 0


def test_mixed_step_bench_times_the_c_forward_and_the_layers_side_by_side(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    rows = _run_tiny_mixed_step_bench(tiny_model_dir, tmp_path, "--forward", "both")["rows"]
    timed = {(row["step"], row["forward"]) for row in rows if row["step_ms"] > 0}
    steps = ("mixed", "decodes only", "chunk only")
    assert timed == {(step, forward) for step in steps for forward in ("c", "layers")}


@pytest.mark.parametrize(
    ("argv", "labels", "budget"),
    [
        (
            ["--mode", "prefill", "--prefill-lengths", "512,2048"],
            ["prefill-512", "prefill-2048"],
            2048,
        ),
        (["--mode", "prefill", "--prefill-lengths", "100"], ["prefill-100"], 512),
        ([], ["throughput"], 512),
    ],
)
def test_vllm_throughput_prefill_mode_gives_both_engines_a_budget_of_the_longest_prompt(
    argv: list[str], labels: list[str], budget: int
) -> None:
    parser = vllm_throughput.build_parser()
    args = parser.parse_args(["--model", "unused", *argv])
    assert [w.label for w in vllm_throughput.workloads(args)] == labels
    config = vllm_throughput.engine_config(args)
    assert config.step_token_budget == budget
    longest = max(w.prompt_tokens + w.output_tokens for w in vllm_throughput.workloads(args))
    assert config.max_model_len is not None and config.max_model_len > longest


def test_prefill_rounds_draw_fresh_prompts() -> None:
    # The same prompts in two rounds would be served from the prefix cache the second time.
    first = vllm_throughput._requests("n-prefill-512-0", 2, 64, 1)
    second = vllm_throughput._requests("n-prefill-512-1", 2, 64, 1)
    assert first[0].prompt_token_ids != second[0].prompt_token_ids
    assert first[0].prompt_token_ids != first[1].prompt_token_ids
