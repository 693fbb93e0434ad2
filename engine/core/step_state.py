"""The chunks one step has chosen so far, while the scheduler fills it (engine/core/scheduler.py),
and the per-(class, kind) token totals a finished step reports."""

from __future__ import annotations

from engine.core.scheduler_output import Preemption, ScheduledChunk
from engine.core.sequence import Sequence
from policies.request_class import RequestClass

__all__ = ["StepState", "tokens_by_kind"]


class StepState:
    """Chunks chosen so far in this step; a preempted victim's chunk is taken back."""

    def __init__(self, budget_tokens: int):
        self.budget_left_tokens = budget_tokens
        self.chunks: dict[str, ScheduledChunk] = {}
        self.preemptions: list[Preemption] = []

    def add(self, seq: Sequence, num_tokens: int) -> None:
        end = seq.num_computed_tokens + num_tokens
        chunk = ScheduledChunk(seq, seq.num_computed_tokens, num_tokens, end == seq.num_tokens)
        self.chunks[seq.seq_id] = chunk
        self.budget_left_tokens -= num_tokens

    def take_back(self, seq: Sequence) -> None:
        chunk = self.chunks.pop(seq.seq_id, None)
        if chunk is not None:
            self.budget_left_tokens += chunk.num_tokens


def tokens_by_kind(chunks: list[ScheduledChunk]) -> dict[tuple[RequestClass, str], int]:
    totals: dict[tuple[RequestClass, str], int] = {}
    for chunk in chunks:
        key = (chunk.seq.request_class, "decode" if chunk.is_decode else "prefill")
        totals[key] = totals.get(key, 0) + chunk.num_tokens
    return totals
