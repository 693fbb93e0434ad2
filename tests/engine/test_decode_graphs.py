"""The padded static decode path (CUDA graphs on a GPU): buckets, the scratch block, and where
the runner takes it. Its exactness against the dense reference is in test_engine_exactness.py
(the "eager" mode runs the same path without graphs on any device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.model.decode_graphs import (
    BATCH_BUCKETS,
    WIDTH_BUCKET_BLOCKS,
    DecodeGraphs,
    graph_bucket,
)


def test_a_step_pads_to_the_next_batch_and_width_bucket() -> None:
    assert graph_bucket(1, 1) == (1, WIDTH_BUCKET_BLOCKS)
    assert graph_bucket(3, WIDTH_BUCKET_BLOCKS) == (4, WIDTH_BUCKET_BLOCKS)
    assert graph_bucket(9, WIDTH_BUCKET_BLOCKS + 1) == (12, 2 * WIDTH_BUCKET_BLOCKS)
    assert graph_bucket(BATCH_BUCKETS[-1], 0) == (BATCH_BUCKETS[-1], WIDTH_BUCKET_BLOCKS)
    # Past the largest bucket the step runs eagerly.
    assert graph_bucket(BATCH_BUCKETS[-1] + 1, 1) is None
    assert list(BATCH_BUCKETS) == sorted(set(BATCH_BUCKETS))


def _engine(model_dir: Path, decode_graphs: str, num_kv_blocks: int = 32) -> LLMEngine:
    config = EngineConfig(
        max_active_seqs=8,
        step_token_budget=64,
        num_kv_blocks=num_kv_blocks,
        block_size_tokens=4,
        device="cpu",
        decode_graphs=decode_graphs,
    )
    return LLMEngine(model_dir, config)


def test_the_static_path_has_a_scratch_block_past_the_managers(tiny_model_dir: Path) -> None:
    eager = _engine(tiny_model_dir, "eager")
    assert eager.runner.kv_cache.shape[2] == 33  # the block manager's 32, and the scratch
    assert eager.block_manager.num_free_blocks == 32
    graphs = eager.runner.decode_graphs
    assert graphs is not None and graphs.scratch_block == 32 and not graphs.capture
    # On a CPU "auto" means no static path, and the cache is the block manager's alone.
    auto = _engine(tiny_model_dir, "auto")
    assert auto.runner.decode_graphs is None and auto.runner.kv_cache.shape[2] == 32
    with pytest.raises(ValueError, match="decode_graphs"):
        EngineConfig(decode_graphs="always")
    with pytest.raises(ValueError, match="scratch block"):
        DecodeGraphs(eager.runner.model, eager.runner.kv_cache, 4, 33, capture=False)


def _written_slots(cache: torch.Tensor) -> set[int]:
    """Slots (block * block_size + offset) any layer's K or V holds a nonzero value in."""
    layers, kv, blocks, block_size = cache.shape[:4]
    flat = cache.reshape(layers * kv, blocks * block_size, -1)
    return set(torch.nonzero(flat.abs().sum(dim=(0, 2))).flatten().tolist())


def test_padded_rows_write_only_the_scratch_block(tiny_model_dir: Path) -> None:
    """Decodes in a bucket of four: the padded rows' K/V land in the scratch block only, and a
    row that a full step filled is not written again when the next step leaves it padded."""
    engine = _engine(tiny_model_dir, "eager")
    graphs = engine.runner.decode_graphs
    assert graphs is not None
    cache, size = engine.runner.kv_cache, graphs.block_size
    scratch_slot = graphs.scratch_block * size

    def step(rows: list[int]) -> torch.Tensor | None:
        """One decode per given block (its first slot, one key), through the static path."""
        count = len(rows)
        return graphs.logits(
            torch.arange(5, 5 + count),
            torch.zeros(count, dtype=torch.long),
            torch.tensor([block * size for block in rows]),
            torch.ones(count, dtype=torch.long),
            torch.tensor(rows).view(count, 1),
            width_blocks=1,
        )

    logits = step([0, 1, 2])  # the bucket of four, one padded row
    assert logits is not None and logits.shape == (3, engine.model_config.vocab_size)
    assert _written_slots(cache) == {0, size, 2 * size, scratch_slot}
    cache.zero_()
    assert step([3, 4, 5, 6]) is not None  # the same bucket, full
    assert _written_slots(cache) == {3 * size, 4 * size, 5 * size, 6 * size}
    cache.zero_()
    assert step([7, 8, 9]) is not None  # block 6's row is padding again: back to the scratch
    assert _written_slots(cache) == {7 * size, 8 * size, 9 * size, scratch_slot}
    assert graphs.steps_served == 3 and len(graphs._buckets) == 1


def test_an_moe_model_never_takes_the_static_path(tmp_path: Path) -> None:
    from engine.model.make_model import make_model

    folder = make_model(tmp_path / "moe", "tiny-moe", seed=0)
    engine = LLMEngine(folder, EngineConfig(device="cpu", decode_graphs="eager", num_kv_blocks=8))
    assert engine.runner.decode_graphs is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_decode_steps_replay_graphs(tiny_model_dir: Path) -> None:
    config = EngineConfig(max_active_seqs=4, num_kv_blocks=32, block_size_tokens=4, device="cuda")
    engine = LLMEngine(tiny_model_dir, config)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(GenerationRequest(f"r{i}", (1, 2, 3 + i), greedy))
    while engine.has_unfinished_requests():
        engine.step()
    graphs = engine.runner.decode_graphs
    assert graphs is not None and graphs.disabled_reason is None, graphs
    assert graphs.replays > 0 and graphs.replays == graphs.steps_served


def test_the_padded_path_without_a_decode_kernel_stays_exact(tiny_model_dir: Path) -> None:
    """The static path's own gather + SDPA with a mask (CUDA without Triton takes it): the
    exactness test's chunking, preemption and prefix sharing, through it."""
    from tests.engine.test_engine_exactness import test_greedy_matches_dense_reference

    test_greedy_matches_dense_reference(
        tiny_model_dir,
        13,
        24,
        8,
        device="cpu",
        decode_graphs="eager",
        paged_attention_kernel=False,
    )
