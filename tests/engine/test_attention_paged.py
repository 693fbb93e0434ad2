"""Paged attention equals dense attention over each sequence's own keys, and uses fused kernels.

A mixed step as serving makes them (decodes over contexts of many lengths in several length
groups, a prefill chunk in the middle of its prompt, a first chunk) over blocks scattered in
the cache: every query's output must equal softmax(q·K/sqrt(d))·V computed in float64 over
exactly the keys it may see, read back from the cache through its block table. Both paths:
the paged decode and prefill kernels over the cache in place (the CPU default), and gathered
copies through torch's SDPA (`paged_kernel=False`, and every device the kernels do not run on).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.profiler import profile

from bench.engine.mixed_step import MixedStepShape, blocks_for, build_mixed_step
from engine.core.scheduler_output import ScheduledChunk
from engine.model import runner as model_runner
from engine.model.attention import PagedAttention
from engine.model.runner import ModelRunner
from engine.model.weights import load_model

BLOCK_SIZE = 4


def _runner(model_dir: Path, num_blocks: int, *, paged_kernel: bool = False) -> ModelRunner:
    model, _ = load_model(model_dir, torch.float32, torch.device("cpu"))
    runner = ModelRunner(
        model,
        num_blocks,
        BLOCK_SIZE,
        torch.float32,
        torch.device("cpu"),
        seed=0,
        prepack=False,
        paged_kernel=paged_kernel,
    )
    assert (runner.decode_kernel is not None) == paged_kernel, "the kernel was meant to build"
    assert (runner.prefill_kernel is not None) == paged_kernel, "the kernel was meant to build"
    return runner


def _mixed_step(runner: ModelRunner) -> list[ScheduledChunk]:
    shape = MixedStepShape(
        decodes=9,
        min_context_tokens=2,
        max_context_tokens=90,
        prefill_chunk_tokens=23,
        prefill_start_pos=37,
        seed=3,
    )
    step = build_mixed_step(runner, shape)
    first = build_mixed_step(
        runner, MixedStepShape(decodes=0, prefill_chunk_tokens=11, prefill_start_pos=0, seed=4)
    )
    # The second step's blocks overlap the first's (each draws from the whole cache): give the
    # first chunk blocks of its own, past every block the mixed step holds.
    used = {b for c in step.chunks for b in c.seq.block_table}
    spare = [b for b in range(runner.kv_cache.shape[2]) if b not in used]
    first_seq = first.chunks[0].seq
    first_seq.block_table[:] = spare[: len(first_seq.block_table)]
    # The runner's order: single-token chunks first, shortest context first, then prefills.
    chunks = [*step.chunks, *first.chunks]
    return sorted(chunks, key=lambda c: (c.num_tokens != 1, c.end_pos))


def _reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, chunks: list[ScheduledChunk]
) -> torch.Tensor:
    """float64 attention of each query over the cache positions it may see."""
    heads, kv_heads, head_dim = q.shape[1], k_cache.shape[2], q.shape[2]
    group = heads // kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    row = 0
    for chunk in chunks:
        slots = torch.tensor(
            [
                chunk.seq.block_table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE
                for p in range(chunk.end_pos)
            ]
        )
        keys = k_cache.flatten(0, 1)[slots].double()  # [context, kv_heads, d]
        values = v_cache.flatten(0, 1)[slots].double()
        for i in range(chunk.num_tokens):
            visible = chunk.start_pos + i + 1
            for h in range(heads):
                scores = keys[:visible, h // group] @ q[row + i, h].double() / math.sqrt(head_dim)
                out[row + i, h] = torch.softmax(scores, 0) @ values[:visible, h // group]
        row += chunk.num_tokens
    return out


def _attend(runner: ModelRunner, chunks: list[ScheduledChunk]) -> tuple[torch.Tensor, ...]:
    config = runner.model.config
    total = sum(c.num_tokens for c in chunks)
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    q = torch.randn(total, heads, d, generator=generator)
    k = torch.randn(total, kv_heads, d, generator=generator)
    v = torch.randn(total, kv_heads, d, generator=generator)
    runner.kv_cache.normal_(generator=generator)  # whatever earlier steps left there
    with torch.inference_mode():
        inputs = runner.inputs.build(chunks)
        meta = runner._metadata(chunks, inputs)
        attention = PagedAttention(
            runner.kv_cache,
            meta,
            runner.gather_buffers,
            runner.decode_kernel,
            runner.prefill_kernel,
        )
        out = attention.attend(0, q, k, v)
    return q, out


@pytest.mark.parametrize("paged_kernel", [True, False], ids=["paged-kernel", "gather-sdpa"])
def test_mixed_step_equals_dense_attention_over_scattered_blocks(
    tiny_model_dir: Path, paged_kernel: bool
) -> None:
    runner = _runner(tiny_model_dir, num_blocks=400, paged_kernel=paged_kernel)
    chunks = _mixed_step(runner)
    assert len({c.num_tokens for c in chunks}) >= 3, "decodes, a middle chunk and a first chunk"
    q, out = _attend(runner, chunks)
    with torch.inference_mode():
        meta = runner._metadata(chunks, runner.inputs.build(chunks))
        meta_groups = meta.decodes
    if paged_kernel:
        # Every decode in one call, each over its own context: no padding, no mask.
        (group,) = meta_groups
        assert group.mask is None and group.context_lens is not None
        # Prefill spans too: the kernel masks by position, so no span carries a mask.
        assert all(span.mask is None for span in meta.prefills)
        decodes = [c for c in chunks if c.num_tokens == 1]
        assert group.context_lens.tolist() == [c.end_pos for c in decodes]
    else:
        assert len(meta_groups) >= 2, "contexts this spread were meant to make several groups"
    expected = _reference(q, runner.kv_cache[0, 0], runner.kv_cache[0, 1], chunks)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


def test_cache_sized_decode_groups_give_the_same_attention(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(tiny_model_dir, num_blocks=400)
    chunks = _mixed_step(runner)
    # A cap of a few blocks' K/V: most decodes get a group of their own.
    monkeypatch.setattr(model_runner, "DECODE_GROUP_BYTES", 8 << 10)
    q, out = _attend(runner, chunks)
    with torch.inference_mode():
        groups = runner._metadata(chunks, runner.inputs.build(chunks)).decodes
    block_bytes = 2 * runner.kv_cache[0, 0, 0].numel() * runner.kv_cache.element_size()
    for group in groups:
        rows, blocks = group.block_tables.shape
        assert rows == 1 or rows * blocks * block_bytes <= 8 << 10
    assert len(groups) >= 5
    expected = _reference(q, runner.kv_cache[0, 0], runner.kv_cache[0, 1], chunks)
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("counts", "cap_blocks", "sizes"),
    [
        ([1, 1, 2, 2, 3, 9, 9, 10], None, [4, 1, 3]),  # by length only (1.5x + 1)
        ([1, 1, 2, 2, 3, 9, 9, 10], 4, [2, 2, 1, 1, 1, 1]),  # and rows x longest <= 4 blocks
        ([50], 4, [1]),  # one sequence over the cap still gets its group
    ],
)
def test_length_groups_close_on_length_and_on_gathered_bytes(
    counts: list[int], cap_blocks: int | None, sizes: list[int]
) -> None:
    cap = None if cap_blocks is None else cap_blocks * 1000
    assert model_runner.length_groups(counts, 1000, cap) == sizes


def test_masks_are_built_once_per_step_as_additive_floats(tiny_model_dir: Path) -> None:
    runner = _runner(tiny_model_dir, num_blocks=400)
    chunks = _mixed_step(runner)
    with torch.inference_mode():
        meta = runner._metadata(chunks, runner.inputs.build(chunks))
    masks = [g.mask for g in meta.decodes] + [s.mask for s in meta.prefills if s.mask is not None]
    assert masks and all(mask is not None for mask in masks)
    for mask in masks:
        assert mask is not None
        # SDPA would convert a boolean mask in every call of every layer.
        assert mask.dtype == torch.float32
        assert bool(((mask == 0) | (mask == -math.inf)).all())


@pytest.mark.parametrize("start_pos", [0, 37])
def test_prefill_attention_runs_the_flash_kernel_not_the_math_one(
    tiny_model_dir: Path, start_pos: int
) -> None:
    # NOTE: a kernel choice, not a speed: with 3-D inputs torch's CPU SDPA took the math path
    # (a full score matrix, 4-6x slower for a 256-2,048-token chunk) for GQA or masked calls.
    runner = _runner(tiny_model_dir, num_blocks=blocks_for(MixedStepShape(), BLOCK_SIZE))
    shape = MixedStepShape(decodes=0, prefill_chunk_tokens=64, prefill_start_pos=start_pos)
    step = build_mixed_step(runner, shape)
    with profile() as prof:
        _attend(runner, list(step.chunks))
    kernels = {e.key for e in prof.key_averages() if "scaled_dot_product_" in e.key}
    assert "aten::_scaled_dot_product_attention_math" not in kernels, kernels
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels, kernels


@pytest.mark.parametrize(("chunk_tokens", "num_kv_blocks", "block_size"), [(13, 24, 8)])
def test_engine_stays_exact_with_a_decode_group_per_sequence(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunk_tokens: int,
    num_kv_blocks: int,
    block_size: int,
) -> None:
    # The tiny model's blocks are far below the real cap: a 1-byte cap puts every decode in
    # its own group, through the whole engine (chunking, preemption, prefix sharing).
    from tests.engine.test_engine_exactness import test_greedy_matches_dense_reference

    monkeypatch.setattr(model_runner, "DECODE_GROUP_BYTES", 1)
    test_greedy_matches_dense_reference(
        tiny_model_dir,
        chunk_tokens,
        num_kv_blocks,
        block_size,
        device="cpu",
        decode_graphs="auto",
        paged_attention_kernel=False,
    )
