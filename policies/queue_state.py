"""One class's pending queue as the gateway last read it (admission's input)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QueueState"]


@dataclass(frozen=True, slots=True)
class QueueState:
    """One class's pending queue as the gateway last read it."""

    depth: int  # pending requests
    queued_tokens: int  # sum of prompt_tokens + max_tokens over pending requests
    queue_limit: int  # depth at which the queue is full
    # The prompt part of queued_tokens, drained at the faster prefill rate; 0 when unknown.
    queued_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.depth < 0 or self.queued_tokens < 0:
            raise ValueError("depth and queued_tokens must be non-negative")
        if self.queue_limit < 1:
            raise ValueError("queue_limit must be at least 1")
        if not 0 <= self.queued_prompt_tokens <= self.queued_tokens:
            raise ValueError("queued_prompt_tokens must be in [0, queued_tokens]")
