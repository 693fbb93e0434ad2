"""A step's results do not depend on how many threads it runs on: the engine core's thread
governor (engine/process/thread_governor.py) changes the count between steps, so every step
of a run must give the same bits at 1 thread as at 2, prefill, decode and mixed steps alike,
through the C step forward and through the layers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from tests.engine.test_step_forward import _hidden_states_by_step


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _hidden_states(model_dir: Path, threads_of_step: list[int], fused: bool) -> list[torch.Tensor]:
    """Every step's final hidden states for 10 greedy requests of mixed lengths, step i on
    threads_of_step[i % len] threads."""
    config = EngineConfig(
        max_active_seqs=6,
        step_token_budget=64,
        num_kv_blocks=1024,
        block_size_tokens=4,
        device="cpu",
        num_threads=2,
        fused_step_forward=fused,
    )

    def set_threads(step: int) -> None:
        torch.set_num_threads(threads_of_step[step % len(threads_of_step)])

    engine = LLMEngine(model_dir, config)
    return _hidden_states_by_step(
        engine, 10, seed=7, prompt_tokens=(3, 90), max_tokens=(4, 20), before_step=set_threads
    )


@pytest.mark.parametrize("fused", [True, False], ids=["c-forward", "layers"])
@pytest.mark.usefixtures("restore_threads")
def test_every_step_gives_the_same_bits_on_one_thread_as_on_two(
    tiny_model_dir: Path, fused: bool
) -> None:
    fixed = _hidden_states(tiny_model_dir, [2], fused)
    switching = _hidden_states(tiny_model_dir, [1, 2, 2, 1, 1], fused)
    assert len(fixed) == len(switching) > 20
    for index, (a, b) in enumerate(zip(fixed, switching, strict=True)):
        assert torch.equal(a, b), f"step {index}: max diff {(a - b).abs().max().item()}"
