"""bf16 (weights and KV cache) keeps the exactness contract in its own dtype: the engine's greedy
tokens under chunking, preemption and prefix sharing equal the dense reference run in bf16.

bf16 keeps 8 significant bits, so the reference's logits tie or sit an ulp or two apart far
more often than fp32's: where a token differs, the reference's top-2 must be within two bf16
ulps of the top logit (anything else fails). Measured on the tiny model: 40 of 42 sequences
identical, both divergences at exact ties of the reference.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.core.llm_engine import LLMEngine
from tests.engine.test_engine_exactness import (
    DEVICES,
    GRAPH_MODES,
    check_decode_graphs,
    exactness_engine,
    random_prompts,
    reference_greedy,
    run_greedy,
)

MAX_TOKENS = 10


def _divergence_is_bf16_tie(
    engine: LLMEngine, prompt: list[int], ours: list[int], ref: list[int]
) -> tuple[bool, str]:
    for index, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            logits = engine.runner.model.dense_logits(prompt + ref[:index])[-1]
            top2 = logits.topk(2).values
            gap = float(top2[0] - top2[1])
            two_ulps = abs(float(top2[0])) * 2.0**-6
            return gap <= two_ulps, f"token {index}: engine {a}, reference {b}, gap {gap:.3g}"
    return True, "identical"


@pytest.mark.parametrize("decode_graphs", GRAPH_MODES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("chunk_tokens", "num_kv_blocks", "block_size"), [(7, 40, 4), (13, 24, 8)])
def test_bf16_greedy_matches_bf16_dense_reference(
    tiny_model_dir: Path,
    chunk_tokens: int,
    num_kv_blocks: int,
    block_size: int,
    device: str,
    decode_graphs: str,
) -> None:
    engine = exactness_engine(
        tiny_model_dir,
        chunk_tokens,
        num_kv_blocks,
        block_size,
        "bfloat16",
        device=device,
        decode_graphs=decode_graphs,
    )
    assert engine.runner.kv_cache.dtype == torch.bfloat16
    assert engine.runner.kv_cache.device.type == device
    prompts = random_prompts(random.Random(chunk_tokens), 14, engine.model_config.vocab_size)
    outputs, _ = run_greedy(engine, prompts, MAX_TOKENS)
    assert engine.history.total_preemptions > 0, "the pool was meant to force preemption"
    assert engine.block_manager.num_free_blocks == num_kv_blocks
    check_decode_graphs(engine, decode_graphs)
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ours = outputs[f"r{i}"]
            ref = reference_greedy(engine, prompt, MAX_TOKENS)
            assert len(ours) == MAX_TOKENS
            ok, detail = _divergence_is_bf16_tie(engine, prompt, ours, ref)
            assert ok, f"request r{i} diverged: {detail}"
