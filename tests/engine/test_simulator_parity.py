"""The simulator runs the live engine's scheduling: the torch `LLMEngine` on the tiny model and
the `SimulatedEngine` given the same requests (some at t=0, some fed at fixed step indices)
schedule the same (sequence, start, tokens) chunks and the same preemptions, step by step."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler_output import SchedulerOutput
from engine.sim.engine import SimulatedEngine
from planning.costmodel import HardwareRates
from planning.model_shape_from_config import shape_from_hf_config
from policies.request_class import RequestClass

INTERACTIVE, BULK = RequestClass.INTERACTIVE, RequestClass.BULK
# Small pool and budget so that chunking, the bulk cap, slot limits and preemption by
# recompute all happen within a few dozen steps.
CONFIG = EngineConfig(
    max_active_seqs=4,
    step_token_budget=24,
    bulk_prefill_chunk_tokens=8,
    # NOTE: aging reads the clock (wall time live, virtual time simulated): off here, so the
    # schedules may be compared step by step.
    bulk_aging_s=1e6,
    num_kv_blocks=12,
    block_size_tokens=4,
    max_model_len=64,
    device="cpu",
    num_threads=1,
    dtype="float32",
)
# (step index at which it is added, id, class, prompt length, max_tokens)
REQUESTS = [
    (0, "bulk-0", BULK, 30, 6),
    (0, "chat-0", INTERACTIVE, 9, 5),
    (0, "bulk-1", BULK, 17, 9),
    (0, "chat-1", INTERACTIVE, 13, 7),
    (0, "bulk-2", BULK, 11, 4),
    (3, "chat-2", INTERACTIVE, 20, 6),
    (5, "bulk-3", BULK, 25, 5),
    (8, "chat-3", INTERACTIVE, 6, 8),
    (8, "chat-4", INTERACTIVE, 15, 3),
]

Step = tuple[tuple[tuple[str, int, int], ...], tuple[str, ...]]


def _record_steps(engine: LLMEngine) -> list[Step]:
    """Spy on the real scheduler: what each step scheduled (it still does all the work)."""
    steps: list[Step] = []
    schedule: Callable[[float], SchedulerOutput] = engine.scheduler.schedule

    def recording(now_s: float) -> SchedulerOutput:
        output = schedule(now_s)
        chunks = tuple((c.seq.seq_id, c.start_pos, c.num_tokens) for c in output.chunks)
        steps.append((chunks, tuple(p.seq_id for p in output.preemptions)))
        return output

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return steps


def _drive(engine: LLMEngine) -> tuple[list[Step], dict[str, int]]:
    steps = _record_steps(engine)
    lengths: dict[str, int] = {}
    step_index = 0
    while step_index < 500:
        for at_step, request_id, cls, prompt_len, max_tokens in REQUESTS:
            if at_step == step_index:
                prompt = tuple((7 * i + len(request_id) * 31 + at_step) % 250 + 1
                               for i in range(prompt_len))  # fmt: skip
                sampling = SamplingParams(
                    max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False
                )
                engine.add_request(GenerationRequest(request_id, prompt, sampling, cls))
        if not engine.has_unfinished_requests() and step_index > REQUESTS[-1][0]:
            break
        for output in engine.step():
            if output.finished:
                lengths[output.request_id] = output.num_output_tokens
        step_index += 1
    return steps, lengths


def test_live_and_simulated_engines_schedule_identically(tiny_model_dir: Path) -> None:
    live = LLMEngine(tiny_model_dir, CONFIG)
    raw: dict[str, Any] = json.loads((tiny_model_dir / "config.json").read_text())
    simulated = SimulatedEngine(
        raw,
        CONFIG,
        shape=shape_from_hf_config(raw, 4),
        hardware=HardwareRates(1e11, 2e10, "test"),
        num_kv_blocks=10_000,  # config.num_kv_blocks wins, as in the torch engine
    )
    live_steps, live_lengths = _drive(live)
    sim_steps, sim_lengths = _drive(simulated)

    assert sim_steps == live_steps
    assert sim_lengths == live_lengths == {r[1]: r[4] for r in REQUESTS}
    # The comparison covered the interesting cases, not only a trivial schedule.
    preempted = {seq_id for _, preemptions in live_steps for seq_id in preemptions}
    assert preempted, "the pool was meant to be too small for everyone at once"
    chunked = [c for chunks, _ in live_steps for c in chunks if c[2] > 1 and c[1] > 0]
    assert chunked, "some prompt was meant to be prefilled in several chunks"
    assert simulated.block_manager.num_blocks == CONFIG.num_kv_blocks
    # Virtual time moved by the cost model's estimates only.
    assert simulated.executor.steps == len([s for s in sim_steps if s[0]])
    assert simulated.clock() == simulated.executor.busy_s > 0
