"""A step's forward in one C call (engine/model/kernels/step_forward.py), decodes and prefill
chunks: the same bits as the layer-by-layer forward through the same kernels, step after step;
where it is taken and where the layers keep the step. Exactness against the dense reference
under chunking, preemption and prefix sharing is test_engine_exactness.py's, which runs with it
on."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.model.kernels.step_forward import MAX_ROWS
from tests.engine.test_transformers_parity import _add_qkv_biases, _to_qwen2, _variant


def _engine(
    model_dir: Path, fused: bool, *, max_active_seqs: int = 8, step_token_budget: int = 256
) -> LLMEngine:
    config = EngineConfig(
        max_active_seqs=max_active_seqs,
        step_token_budget=step_token_budget,
        num_kv_blocks=1024,
        block_size_tokens=4,
        device="cpu",
        num_threads=2,
        fused_step_forward=fused,
    )
    return LLMEngine(model_dir, config)


def _hidden_states_by_step(
    engine: LLMEngine,
    requests: int,
    seed: int,
    prompt_tokens: tuple[int, int] = (3, 40),
    max_tokens: tuple[int, int] = (4, 24),
    before_step: Callable[[int], None] | None = None,
) -> list[torch.Tensor]:
    """Every step's final hidden states (what the logits are computed from), in step order,
    for `requests` greedy requests of mixed lengths (uniform in the ranges) run to completion;
    `before_step(i)` runs before step i."""
    seen: list[torch.Tensor] = []
    compute_logits = engine.runner.model.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        seen.append(hidden.clone())
        return compute_logits(hidden)

    engine.runner.model.compute_logits = recording  # type: ignore[method-assign]
    rng = random.Random(seed)
    for index in range(requests):
        prompt = [rng.randrange(3, 250) for _ in range(rng.randint(*prompt_tokens))]
        params = SamplingParams(
            max_tokens=rng.randint(*max_tokens), temperature=0.0, ignore_eos=True
        )
        engine.add_request(GenerationRequest(f"req-{index}", prompt, params))
    step = 0
    while engine.has_unfinished_requests():
        if before_step is not None:
            before_step(step)
        engine.step()
        step += 1
    return seen


def _decode_steps(engine: LLMEngine) -> int:
    return sum(
        1
        for record in engine.history.records
        if record.tokens_of("decode") and not record.tokens_of("prefill")
    )


def _same_bits_both_ways(model_dir: Path, requests: int, max_active_seqs: int) -> int:
    fused = _engine(model_dir, True, max_active_seqs=max_active_seqs)
    layers = _engine(model_dir, False, max_active_seqs=max_active_seqs)
    assert fused.runner.step_forward is not None
    assert layers.runner.step_forward is None
    got = _hidden_states_by_step(fused, requests, seed=7)
    want = _hidden_states_by_step(layers, requests, seed=7)
    assert len(got) == len(want)
    for step, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(mine, theirs), f"step {step}: the C forward's hidden states differ"
    decode_steps = _decode_steps(fused)
    assert decode_steps == _decode_steps(layers)
    return decode_steps


def test_decode_steps_are_the_same_bits_as_the_layers(tiny_model_dir: Path) -> None:
    # Staggered lengths: decode steps of many batch sizes, beside prefill steps (the C side's
    # too, up to its rows; past them, the layers') that must leave the same cache behind.
    assert _same_bits_both_ways(tiny_model_dir, requests=12, max_active_seqs=8) >= 10


def test_biased_projections_are_the_same_bits_as_the_layers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = _variant(tiny_model_dir, tmp_path / "qwen2", _to_qwen2)
    _add_qkv_biases(folder, num_layers=2)
    engine = _engine(folder, True)
    assert engine.runner.model.layers[0].self_attn.qkv_proj.bias is not None
    assert _same_bits_both_ways(folder, requests=6, max_active_seqs=6) >= 5


def _rows_asked(engine: LLMEngine) -> list[int]:
    """Rows of each step the runner hands to the C side, recorded as the engine runs."""
    forward = engine.runner.step_forward
    assert forward is not None
    asked: list[int] = []
    hidden = forward.hidden

    def recording(input_ids: torch.Tensor, *rest: torch.Tensor | None) -> torch.Tensor | None:
        asked.append(input_ids.shape[0])
        return hidden(input_ids, *rest)

    forward.hidden = recording  # type: ignore[method-assign]
    return asked


def test_mixed_steps_are_the_same_bits_as_the_layers(tiny_model_dir: Path) -> None:
    # A budget of 24 cuts the prompts (up to 60 tokens) into chunks: steps of decodes beside a
    # first chunk, beside a later chunk over blocks written steps before, and beside several.
    fused, layers = (
        _engine(tiny_model_dir, on, max_active_seqs=6, step_token_budget=24) for on in (True, False)
    )
    spans_asked: list[list[tuple[int, int]]] = []  # each C call's (rows, first position)
    forward = fused.runner.step_forward
    assert forward is not None and forward.takes_prefill
    hidden = forward.hidden

    def recording(*args: torch.Tensor | None) -> torch.Tensor | None:
        spans = args[5] if len(args) > 5 else None
        spans_asked.append([] if spans is None else [tuple(s) for s in spans.tolist()])
        return hidden(*args)  # type: ignore[arg-type]

    forward.hidden = recording  # type: ignore[method-assign]
    got, want = (
        _hidden_states_by_step(e, 10, seed=5, prompt_tokens=(3, 60), max_tokens=(2, 12))
        for e in (fused, layers)
    )
    assert len(got) == len(want)
    for step, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(mine, theirs), f"step {step}: the C forward's hidden states differ"
    # Every step went through the C side (24 rows at most), and it saw each kind of chunk.
    assert len(spans_asked) == len(fused.history.records)
    assert any(first == 0 for spans in spans_asked for _, first in spans)
    assert any(first > 0 for spans in spans_asked for _, first in spans)
    assert any(len(spans) >= 2 for spans in spans_asked)
    decodes_beside = [
        r for r in fused.history.records if r.tokens_of("decode") and r.tokens_of("prefill")
    ]
    assert decodes_beside


def test_a_step_past_the_c_limit_runs_layer_by_layer(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, True, max_active_seqs=MAX_ROWS + 6)
    forward = engine.runner.step_forward
    assert forward is not None
    limit = forward.max_rows  # MAX_ROWS, or the skinny kernel's lower bound on this build
    hidden = forward.hidden
    asked = _rows_asked(engine)
    layers = _engine(tiny_model_dir, False, max_active_seqs=MAX_ROWS + 6)
    got, want = (
        _hidden_states_by_step(e, MAX_ROWS + 6, seed=3, prompt_tokens=(3, 5), max_tokens=(20, 24))
        for e in (engine, layers)
    )
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # Steps past the limit (pure decodes of every request at once, prefills of many) went layer
    # by layer; the smaller ones, as the requests finished, through the C side.
    records = engine.history.records
    rows_of_steps = [r.tokens_of("decode") + r.tokens_of("prefill") for r in records]
    assert max(rows_of_steps) > limit
    assert asked and max(asked) <= limit
    assert len(asked) == sum(1 for rows in rows_of_steps if rows <= limit)
    # Asked directly, it refuses such a batch (its scratch holds MAX_ROWS rows).
    rows = limit + 1
    ids = torch.zeros(rows, dtype=torch.long)
    tables = torch.zeros(rows, 1, dtype=torch.long)
    assert hidden(ids, ids, ids, tables, torch.ones(rows, dtype=torch.long)) is None


def test_it_is_off_where_the_layers_do_not_run_on_the_c_kernels(tiny_model_dir: Path) -> None:
    assert _engine(tiny_model_dir, False).runner.step_forward is None
    no_skinny = EngineConfig(num_kv_blocks=64, device="cpu", small_linear_kernel=False)
    assert LLMEngine(tiny_model_dir, no_skinny).runner.step_forward is None
    no_paged = EngineConfig(num_kv_blocks=64, device="cpu", paged_attention_kernel=False)
    assert LLMEngine(tiny_model_dir, no_paged).runner.step_forward is None
    bf16 = EngineConfig(num_kv_blocks=64, device="cpu", dtype="bfloat16")
    assert LLMEngine(tiny_model_dir, bf16).runner.step_forward is None
    # The padded static path (CUDA graphs' shapes) keeps its own forward.
    eager = EngineConfig(num_kv_blocks=64, device="cpu", decode_graphs="eager")
    assert LLMEngine(tiny_model_dir, eager).runner.step_forward is None


@pytest.mark.usefixtures("without_compiler")
def test_without_a_compiler_decode_runs_layer_by_layer(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, True)
    assert engine.runner.step_forward is None
    assert _hidden_states_by_step(engine, requests=2, seed=1)
