"""A serving step as chat-over-backlog makes them: decodes over long contexts plus a prefill chunk.

`mixgate bench engine`'s decode rounds run at one short context; the steps that set chat ITL
under a bulk backlog carry ~30 decodes over 100-1,500-token contexts and a 256-token bulk
chunk at position ~1,000. `build_mixed_step` lays such a step out over a ModelRunner's real
paged cache (blocks taken from a shuffled free list, as after churn), so a benchmark or a
profile can run `runner.execute(step)` repeatedly: re-running a step rewrites the same slots.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass

from engine.core.block_manager import BlockManager
from engine.core.request import RequestMetrics
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler_output import ScheduledChunk, SchedulerOutput
from engine.core.sequence import Sequence, SequenceStatus
from engine.model.runner import ModelRunner
from policies.request_class import RequestClass


@dataclass(frozen=True, slots=True)
class MixedStepShape:
    # Decoding sequences and the range their context lengths are drawn from (uniform).
    decodes: int = 30
    min_context_tokens: int = 100
    max_context_tokens: int = 1500
    # One prefill chunk of this many tokens starting at this position (0 chunk: none).
    prefill_chunk_tokens: int = 256
    prefill_start_pos: int = 1000
    seed: int = 0

    @property
    def label(self) -> str:
        return (
            f"{self.decodes} decodes ctx {self.min_context_tokens}-{self.max_context_tokens}"
            f" + chunk {self.prefill_chunk_tokens}@{self.prefill_start_pos}"
        )


def blocks_for(shape: MixedStepShape, block_size: int) -> int:
    """KV blocks the step needs (an upper bound), for sizing a runner's cache."""
    per_decode = -(-shape.max_context_tokens // block_size)
    prefill = -(-(shape.prefill_start_pos + shape.prefill_chunk_tokens) // block_size)
    return shape.decodes * per_decode + prefill + 1


def _sequence(seq_id: str, num_tokens: int, vocab: int, rng: random.Random) -> Sequence:
    tokens = [rng.randrange(3, vocab) for _ in range(num_tokens)]
    return Sequence(
        seq_id=seq_id,
        request_class=RequestClass.BULK,
        token_ids=tokens,
        num_prompt_tokens=max(1, num_tokens - 1),
        sampling=SamplingParams(temperature=0.0, max_tokens=1 << 20, detokenize=False),
        metrics=RequestMetrics(arrival_s=0.0),
        status=SequenceStatus.RUNNING,
    )


def build_mixed_step(runner: ModelRunner, shape: MixedStepShape) -> SchedulerOutput:
    """A step over `runner`'s cache; blocks are drawn in random order from its whole cache."""
    rng = random.Random(shape.seed)
    num_blocks = runner.kv_cache.shape[2]
    blocks = BlockManager(num_blocks, runner.block_size, enable_prefix_caching=False)
    # Shuffle the free list: a long-running server's blocks are scattered, not contiguous.
    order = list(range(num_blocks))
    rng.shuffle(order)
    blocks._free = OrderedDict.fromkeys(order)
    vocab = runner.model.config.vocab_size
    chunks = []
    for index in range(shape.decodes):
        context = rng.randint(shape.min_context_tokens, shape.max_context_tokens)
        seq = _sequence(f"s{shape.seed}-decode-{index}", context, vocab, rng)
        if blocks.allocate_slots(seq, context) is None:
            raise ValueError("the runner's cache is too small for this step")
        seq.num_computed_tokens = context - 1
        chunks.append(ScheduledChunk(seq, context - 1, 1, samples=True))
    if shape.prefill_chunk_tokens:
        end = shape.prefill_start_pos + shape.prefill_chunk_tokens
        seq = _sequence(f"s{shape.seed}-prefill", end + 64, vocab, rng)
        seq.num_computed_tokens = shape.prefill_start_pos
        if blocks.allocate_slots(seq, shape.prefill_chunk_tokens) is None:
            raise ValueError("the runner's cache is too small for this step")
        # A bulk chunk in the middle of its prompt: nothing sampled.
        chunks.append(
            ScheduledChunk(seq, shape.prefill_start_pos, shape.prefill_chunk_tokens, False)
        )
    return SchedulerOutput(step_index=0, chunks=tuple(chunks))
