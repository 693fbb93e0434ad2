"""The model runner's role without a model: step time from the cost model, tokens from a seed.

Given a `SchedulerOutput` it returns one token per chunk that samples (a decode, or the last
chunk of a prompt) like `ModelRunner.execute`, and moves a `VirtualClock` forward by the
cost model's estimate of that step (`planning.costmodel.mixed_step_estimate_s`). Nothing
sleeps and nothing runs in a thread: a simulated second costs microseconds of CPU.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine.core.scheduler_output import SchedulerOutput
from planning.costmodel import HardwareRates, ModelShape, mixed_step_estimate_s

__all__ = ["SimulatedExecutor", "SimulatedSampler", "StepShape", "VirtualClock", "step_shape"]


class VirtualClock:
    """Seconds since the simulation began; only the simulator moves it."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        if not seconds >= 0:
            raise ValueError(f"time only moves forward, got {seconds!r}")
        self.now_s += seconds

    def advance_to(self, at_s: float) -> None:
        self.now_s = max(self.now_s, at_s)


@dataclass(frozen=True, slots=True)
class StepShape:
    """What the cost model needs to know about one step."""

    prefill_tokens: int  # prompt (or recompute) chunk tokens
    decode_seqs: int  # sequences decoding one token
    decode_context_tokens: int  # the decodes' mean cached length (their cache reads)
    # (tokens, tokens already cached before the chunk) per prefill chunk.
    prefill_chunks: tuple[tuple[int, int], ...] = ()


def step_shape(output: SchedulerOutput) -> StepShape:
    decodes = [c for c in output.chunks if c.is_decode]
    chunks = tuple((c.num_tokens, c.start_pos) for c in output.chunks if not c.is_decode)
    # A decode reads the K/V of every position before it: start_pos of its one-token chunk.
    context = sum(c.start_pos for c in decodes)
    mean_context = round(context / len(decodes)) if decodes else 0
    return StepShape(sum(n for n, _ in chunks), len(decodes), mean_context, chunks)


class SimulatedSampler:
    """Deterministic token ids per (seed, sequence, position), never an EOS id.

    NOTE: the value of a token matters to the scheduler only through prefix-cache hashes, so
    any seeded stream will do; EOS is skipped because simulated requests end at max_tokens.
    A splitmix64 step per token: a fraction of `random.Random`'s cost per call.
    """

    def __init__(self, seed: int, vocab_size: int, eos_token_ids: Iterable[int] = ()) -> None:
        if vocab_size < 2:
            raise ValueError("vocab_size must be at least 2")
        self.seed = seed
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        if len(self.eos_token_ids & set(range(vocab_size))) >= vocab_size:
            raise ValueError("every token id is an EOS id")
        # Per sequence: the splitmix64 state of its next token.
        self._states: dict[str, int] = {}

    def next_token(self, seq_id: str) -> int:
        state = self._states.get(seq_id)
        if state is None:
            # sha256, not hash(): stable across processes and PYTHONHASHSEED.
            digest = hashlib.sha256(f"{self.seed}:{seq_id}".encode()).digest()
            state = int.from_bytes(digest[:8], "little")
        state = (state + _GOLDEN_GAMMA) & _MASK_64
        self._states[seq_id] = state
        mixed = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
        mixed = ((mixed ^ (mixed >> 27)) * 0x94D049BB133111EB) & _MASK_64
        token = (mixed ^ (mixed >> 31)) % self.vocab_size
        while token in self.eos_token_ids:
            token = (token + 1) % self.vocab_size
        return token

    def forget(self, seq_id: str) -> None:
        """The sequence finished (the engine calls this as it does on the torch sampler)."""
        self._states.pop(seq_id, None)


_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MASK_64 = (1 << 64) - 1


class SimulatedExecutor:
    """`execute(output)`: advance the clock by the estimated step time, return the tokens."""

    def __init__(
        self,
        shape: ModelShape,
        hardware: HardwareRates,
        clock: VirtualClock,
        sampler: SimulatedSampler,
        *,
        estimate_s: Callable[[ModelShape, HardwareRates, StepShape], float] | None = None,
    ) -> None:
        self.shape = shape
        self.hardware = hardware
        self.clock = clock
        self.sampler = sampler
        self._estimate_s = estimate_s or cost_model_step_s
        # Simulated seconds spent in steps, and how many: what `bench simulate` reports.
        self.busy_s = 0.0
        self.steps = 0

    def step_time_s(self, output: SchedulerOutput) -> float:
        return self._estimate_s(self.shape, self.hardware, step_shape(output))

    def execute(self, output: SchedulerOutput) -> dict[str, int]:
        step_s = self.step_time_s(output)
        self.clock.advance(step_s)
        self.busy_s += step_s
        self.steps += 1
        return {
            c.seq.seq_id: self.sampler.next_token(c.seq.seq_id) for c in output.chunks if c.samples
        }


def cost_model_step_s(shape: ModelShape, hardware: HardwareRates, step: StepShape) -> float:
    """The cost model's step time (with the hardware's fixed per-step overhead, where set)."""
    estimate = mixed_step_estimate_s(
        shape,
        hardware,
        step.prefill_tokens,
        step.decode_seqs,
        step.decode_context_tokens,
        prefill_chunks=step.prefill_chunks,
    )
    return estimate.step_s
