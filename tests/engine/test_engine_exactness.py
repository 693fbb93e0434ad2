"""Same tokens, any schedule: the engine's greedy output equals a dense, cache-free reference.

The engine runs many sequences at once with odd prefill chunks, a KV pool small enough to
force preemptions and prefix sharing on; the reference runs the same model on each sequence
alone, recomputing the whole sequence for every token. Where a token differs, the reference's
top-2 logits must be within 1e-5 (a near-tie that fp32 reordering can flip); anything else fails.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from policies.request_class import RequestClass

NEAR_TIE = 1e-5

# Every exactness test runs on the CPU, and on CUDA too where a GPU is present (the paged path
# there is torch's gather + SDPA, with no C kernels): the same assertions on either device.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def random_prompts(rng: random.Random, count: int, vocab: int) -> list[list[int]]:
    shared = [rng.randrange(vocab) for _ in range(24)]  # a common "system prompt"
    prompts = []
    for i in range(count):
        body = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        prompts.append(shared + body if i % 3 == 0 else body)
    return prompts


def reference_greedy(engine: LLMEngine, prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(engine.runner.model.dense_logits(tokens)[-1].argmax()))
    return tokens[len(prompt) :]


def first_divergence_is_near_tie(
    engine: LLMEngine, prompt: list[int], ours: list[int], ref: list[int]
) -> tuple[bool, str]:
    for index, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            logits = engine.runner.model.dense_logits(prompt + ref[:index])[-1]
            top2 = logits.topk(2).values
            gap = float(top2[0] - top2[1])
            return gap <= NEAR_TIE, f"token {index}: engine {a}, reference {b}, top-2 gap {gap:.3g}"
    return True, "identical"


def exactness_engine(
    model_dir: Path,
    chunk_tokens: int,
    num_kv_blocks: int,
    block_size: int,
    dtype: str,
    *,
    enable_prefix_caching: bool = False,
    paged_attention_kernel: bool = True,
    device: str = "cpu",
    decode_graphs: str = "auto",
) -> LLMEngine:
    """Six sequences at once, odd chunks, a small KV pool: the set-up every exactness test runs."""
    config = EngineConfig(
        paged_attention_kernel=paged_attention_kernel,
        max_active_seqs=6,
        step_token_budget=max(chunk_tokens, 6) + 6,
        bulk_prefill_chunk_tokens=chunk_tokens,
        num_kv_blocks=num_kv_blocks,
        block_size_tokens=block_size,
        enable_prefix_caching=enable_prefix_caching,
        device=device,
        dtype=dtype,
        decode_graphs=decode_graphs,
    )
    return LLMEngine(model_dir, config)


def run_greedy(
    engine: LLMEngine,
    prompts: list[list[int]],
    max_tokens: int,
    *,
    alternate_classes: bool = False,
    check_every_step: bool = False,
) -> tuple[dict[str, list[int]], int]:
    """Every prompt as request r{i} (greedy, EOS ignored), run to the end: the tokens of each
    and the prompt tokens the prefix cache served. `alternate_classes`: odd requests are bulk;
    `check_every_step`: the block manager's invariants after every step."""
    for i, prompt in enumerate(prompts):
        request_class = (
            RequestClass.BULK if alternate_classes and i % 2 else RequestClass.INTERACTIVE
        )
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(GenerationRequest(f"r{i}", tuple(prompt), sampling, request_class))
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    cached = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finished and out.metrics is not None:
                cached += out.metrics.num_cached_prompt_tokens
        if check_every_step:
            engine.block_manager.check_invariants()
    return outputs, cached


def check_decode_graphs(engine: LLMEngine, decode_graphs: str) -> None:
    """The static decode path served steps where it should: CUDA graphs replayed on a GPU
    ("auto"), the padded path without graphs anywhere ("eager"); none elsewhere."""
    graphs = engine.runner.decode_graphs
    if decode_graphs == "eager":
        assert graphs is not None and graphs.steps_served > 0
        assert graphs.replays == 0
    elif engine.device.type == "cuda":
        assert graphs is not None, "CUDA runs pure-decode steps as graphs by default"
        assert graphs.disabled_reason is None, graphs.disabled_reason
        assert graphs.replays > 0 and graphs.graphs_captured > 0
    else:
        assert graphs is None


# "auto" is each device's default path (CUDA graphs on a GPU); "eager" runs the padded static
# decode path without graphs, so its padding and scratch rows are tested on every machine.
GRAPH_MODES = ["auto", "eager"]


@pytest.mark.parametrize("decode_graphs", GRAPH_MODES)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("chunk_tokens", "num_kv_blocks", "block_size"),
    [(7, 40, 4), (13, 24, 8), (64, 200, 16)],
)
def test_greedy_matches_dense_reference(
    tiny_model_dir: Path,
    chunk_tokens: int,
    num_kv_blocks: int,
    block_size: int,
    device: str,
    decode_graphs: str,
    paged_attention_kernel: bool = True,
) -> None:
    engine = exactness_engine(
        tiny_model_dir,
        chunk_tokens,
        num_kv_blocks,
        block_size,
        "float32",
        enable_prefix_caching=True,
        paged_attention_kernel=paged_attention_kernel,
        device=device,
        decode_graphs=decode_graphs,
    )
    assert engine.device.type == device
    # The default path: the C kernel on CPU (tests/engine/test_paged_decode_kernel.py covers
    # it), Triton's on CUDA where Triton is installed (tests/engine/test_paged_decode_triton.py).
    has_triton = importlib.util.find_spec("triton") is not None
    expect_kernel = paged_attention_kernel and (device == "cpu" or has_triton)
    assert (engine.runner.decode_kernel is not None) == expect_kernel
    rng = random.Random(chunk_tokens)
    prompts = random_prompts(rng, 14, engine.model_config.vocab_size)
    max_tokens = 10
    outputs, cached = run_greedy(
        engine, prompts, max_tokens, alternate_classes=True, check_every_step=True
    )

    if num_kv_blocks < 100:
        assert engine.history.total_preemptions > 0, "the pool was meant to force preemption"
    assert cached > 0, "shared prefixes were meant to hit the prefix cache"
    assert engine.block_manager.num_free_blocks == num_kv_blocks
    check_decode_graphs(engine, decode_graphs)

    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ours = outputs[f"r{i}"]
            ref = reference_greedy(engine, prompt, max_tokens)
            assert len(ours) == max_tokens
            ok, detail = first_divergence_is_near_tie(engine, prompt, ours, ref)
            assert ok, f"request r{i} diverged: {detail}"
