"""What the scheduler decided for one step: the contract between scheduler and executor."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.core.sequence import Sequence
from policies.request_class import RequestClass


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    # The sequence (mutable; the executor reads token ids and the block table only).
    seq: Sequence
    # Position of the first token of this chunk (num_computed_tokens when scheduled).
    start_pos: int
    # Tokens computed this step: 1 for a decode, up to the budget for a prefill chunk.
    num_tokens: int
    # The chunk reaches the end of the sequence, so its last position's logits are sampled.
    samples: bool

    @property
    def end_pos(self) -> int:
        return self.start_pos + self.num_tokens

    @property
    def is_decode(self) -> bool:
        return self.seq.num_output_tokens > 0 and self.num_tokens == 1 and self.samples


@dataclass(frozen=True, slots=True)
class Preemption:
    seq_id: str
    victim_class: RequestClass
    # The class of the sequence the blocks or slot were taken for.
    beneficiary_class: RequestClass


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    step_index: int
    # Decode chunks first, then prefill chunks, each group in scheduling order.
    chunks: tuple[ScheduledChunk, ...]
    # Sequences preempted (by recompute) while this step was scheduled.
    preemptions: tuple[Preemption, ...] = ()
    # Tokens the budget guaranteed to bulk this step (aged bulk), for invariant checks.
    bulk_guaranteed_tokens: int = 0
    # Scheduled tokens split by (class, "prefill" | "decode").
    tokens_by_kind: dict[tuple[RequestClass, str], int] = field(default_factory=dict)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks

    def tokens_for(self, request_class: RequestClass) -> int:
        return sum(c.num_tokens for c in self.chunks if c.seq.request_class is request_class)
