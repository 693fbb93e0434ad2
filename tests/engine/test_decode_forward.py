"""A pure-decode step's forward in one C call (engine/model/kernels/decode_forward.py): the same
bits as the layer-by-layer forward through the same kernels, step after step; where it is taken
and where the layers keep the step. Exactness against the dense reference under chunking,
preemption and prefix sharing is test_engine_exactness.py's, which runs with it on."""

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
from engine.model.kernels.decode_forward import MAX_ROWS
from tests.engine.test_transformers_parity import _add_qkv_biases, _to_qwen2, _variant


def _engine(model_dir: Path, fused: bool, *, max_active_seqs: int = 8) -> LLMEngine:
    config = EngineConfig(
        max_active_seqs=max_active_seqs,
        step_token_budget=256,
        num_kv_blocks=1024,
        block_size_tokens=4,
        device="cpu",
        num_threads=2,
        fused_decode_forward=fused,
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
    assert fused.runner.decode_forward is not None
    assert layers.runner.decode_forward is None
    got = _hidden_states_by_step(fused, requests, seed=7)
    want = _hidden_states_by_step(layers, requests, seed=7)
    assert len(got) == len(want)
    for step, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(mine, theirs), f"step {step}: the C forward's hidden states differ"
    decode_steps = _decode_steps(fused)
    assert decode_steps == _decode_steps(layers)
    return decode_steps


def test_decode_steps_are_the_same_bits_as_the_layers(tiny_model_dir: Path) -> None:
    # Staggered lengths: decode steps of many batch sizes, beside prefill steps that take the
    # layers on both engines and must leave the same cache behind.
    assert _same_bits_both_ways(tiny_model_dir, requests=12, max_active_seqs=8) >= 10


def test_biased_projections_are_the_same_bits_as_the_layers(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = _variant(tiny_model_dir, tmp_path / "qwen2", _to_qwen2)
    _add_qkv_biases(folder, num_layers=2)
    engine = _engine(folder, True)
    assert engine.runner.model.layers[0].self_attn.qkv_proj.bias is not None
    assert _same_bits_both_ways(folder, requests=6, max_active_seqs=6) >= 5


def test_a_decode_batch_past_the_c_limit_runs_layer_by_layer(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, True, max_active_seqs=MAX_ROWS + 6)
    forward = engine.runner.decode_forward
    assert forward is not None
    asked: list[int] = []  # rows of each step handed to the C side
    hidden = forward.hidden

    def recording(input_ids: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor | None:
        asked.append(input_ids.shape[0])
        return hidden(input_ids, *rest)

    forward.hidden = recording  # type: ignore[method-assign]
    layers = _engine(tiny_model_dir, False, max_active_seqs=MAX_ROWS + 6)
    got, want = (
        _hidden_states_by_step(e, MAX_ROWS + 6, seed=3, prompt_tokens=(3, 5), max_tokens=(20, 24))
        for e in (engine, layers)
    )
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # Pure decodes of every request at once, past the C side's limit, went layer by layer;
    # the smaller ones, as the requests finished, through the C side.
    pure_decodes = [
        record.tokens_of("decode")
        for record in engine.history.records
        if not record.tokens_of("prefill")
    ]
    assert max(pure_decodes) > MAX_ROWS
    assert asked and max(asked) <= MAX_ROWS
    assert len(asked) == sum(1 for rows in pure_decodes if rows <= MAX_ROWS)
    # Asked directly, it refuses such a batch (its scratch holds MAX_ROWS rows).
    rows = MAX_ROWS + 1
    ids = torch.zeros(rows, dtype=torch.long)
    tables = torch.zeros(rows, 1, dtype=torch.long)
    assert hidden(ids, ids, ids, tables, torch.ones(rows, dtype=torch.long)) is None


def test_it_is_off_where_the_layers_do_not_run_on_the_c_kernels(tiny_model_dir: Path) -> None:
    assert _engine(tiny_model_dir, False).runner.decode_forward is None
    no_skinny = EngineConfig(num_kv_blocks=64, device="cpu", small_linear_kernel=False)
    assert LLMEngine(tiny_model_dir, no_skinny).runner.decode_forward is None
    no_paged = EngineConfig(num_kv_blocks=64, device="cpu", paged_attention_kernel=False)
    assert LLMEngine(tiny_model_dir, no_paged).runner.decode_forward is None
    bf16 = EngineConfig(num_kv_blocks=64, device="cpu", dtype="bfloat16")
    assert LLMEngine(tiny_model_dir, bf16).runner.decode_forward is None
    # The padded static path (CUDA graphs' shapes) keeps its own forward.
    eager = EngineConfig(num_kv_blocks=64, device="cpu", decode_graphs="eager")
    assert LLMEngine(tiny_model_dir, eager).runner.decode_forward is None


@pytest.mark.usefixtures("without_compiler")
def test_without_a_compiler_decode_runs_layer_by_layer(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, True)
    assert engine.runner.decode_forward is None
    assert _hidden_states_by_step(engine, requests=2, seed=1)
