"""Mixtral: our MoE model against transformers' MixtralForCausalLM on the same folder (prefill
logits and greedy decode steps with its KV cache), and our paged engine against our own dense
cache-free reference, with tokens of one step routed to different experts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.model.make_model import make_model
from policies.request_class import RequestClass
from tests.dependencies import require_module
from tests.engine.test_engine_exactness import first_divergence_is_near_tie, random_prompts
from tests.engine.test_engine_exactness import reference_greedy as dense_greedy
from tests.engine.test_transformers_parity import (
    FP32_REL_TOL,
    PROMPTS,
    _assert_parity,
    _ours,
    _relative_error,
    _theirs,
)

transformers = require_module("transformers")

DECODE_STEPS = 6


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny-moe"), "tiny-moe", seed=5)


@pytest.fixture(scope="module")
def hf_mixtral(moe_dir: Path) -> Any:
    return _theirs(moe_dir, "MixtralForCausalLM")


def test_transformers_loads_every_expert(moe_dir: Path) -> None:
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        moe_dir, output_loading_info=True
    )
    assert type(model).__name__ == "MixtralForCausalLM"
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"]
    assert model.config.num_local_experts == 4 and model.config.num_experts_per_tok == 2


def test_prefill_matches_transformers_and_routes_tokens_apart(
    moe_dir: Path, hf_mixtral: Any
) -> None:
    ours = _ours(moe_dir)
    _assert_parity(ours, hf_mixtral)
    # The prompts' tokens did not all pick the same experts: each layer of the 8-token
    # prompt's forward computed more than one token's top-2.
    blocks = ours.moe_blocks()
    assert len(blocks) == 2
    touched: list[int] = []  # one entry per layer per forward
    for block in blocks:
        block.touched_log = touched
    ours.dense_logits(PROMPTS[1])
    assert len(touched) == 2 and min(touched) > 2, touched


@torch.inference_mode()
def _hf_greedy(model: Any, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' own cached decoding: the tokens and each step's logits."""
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=steps,
        do_sample=False,
        eos_token_id=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    return out.sequences[0].tolist(), [logits[0].float() for logits in out.logits]


def test_greedy_decode_steps_match_transformers(moe_dir: Path, hf_mixtral: Any) -> None:
    ours = _ours(moe_dir)
    for prompt in PROMPTS[:2]:
        sequence, step_logits = _hf_greedy(hf_mixtral, prompt, DECODE_STEPS)
        assert len(step_logits) == DECODE_STEPS
        for step, reference in enumerate(step_logits):
            mine = ours.dense_logits(sequence[: len(prompt) + step])[-1]
            error = _relative_error(mine, reference)
            assert error < FP32_REL_TOL, f"decode step {step}: relative error {error}"


def test_a_folder_saved_by_transformers_loads_to_the_same_logits(
    moe_dir: Path, hf_mixtral: Any, tmp_path: Path
) -> None:
    # transformers 5 rewrites config.json (rope_theta moves into rope_parameters) and its own
    # tensor order: the folder must still load, and to the same model.
    hf_mixtral.save_pretrained(tmp_path / "resaved")
    original, resaved = _ours(moe_dir), _ours(tmp_path / "resaved")
    for prompt in PROMPTS:
        assert torch.equal(original.dense_logits(prompt), resaved.dense_logits(prompt))


def test_paged_engine_greedy_equals_the_dense_reference(moe_dir: Path) -> None:
    # Odd prefill chunks, a pool small enough to preempt, decodes of many sequences in one
    # step (so a step's tokens route to different experts), prefix caching on.
    config = EngineConfig(
        max_active_seqs=6,
        step_token_budget=13,
        bulk_prefill_chunk_tokens=7,
        num_kv_blocks=12,  # one 90-token sequence fits; six at once do not
        block_size_tokens=8,
        enable_prefix_caching=True,
        device="cpu",
        dtype="float32",
    )
    engine = LLMEngine(moe_dir, config)
    blocks = engine.runner.model.moe_blocks()
    touched: list[int] = []
    for block in blocks:
        block.touched_log = touched
    prompts = random_prompts(random.Random(7), 10, engine.model_config.vocab_size)
    max_tokens = 6
    for i, prompt in enumerate(prompts):
        request_class = RequestClass.BULK if i % 2 else RequestClass.INTERACTIVE
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(GenerationRequest(f"r{i}", tuple(prompt), sampling, request_class))
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
        engine.block_manager.check_invariants()
    assert engine.history.total_preemptions > 0, "the pool was meant to force preemption"
    # Some steps ran tokens that together picked more than one token's top-2.
    assert max(touched) > 2
    for block in blocks:
        block.touched_log = None
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ours = outputs[f"r{i}"]
            assert len(ours) == max_tokens
            reference = dense_greedy(engine, prompt, max_tokens)
            ok, detail = first_divergence_is_near_tie(engine, prompt, ours, reference)
            assert ok, f"request r{i} diverged: {detail}"
