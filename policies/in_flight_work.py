"""The work a replica's own jobs of one class still have to run, as admission reads it.

A bulk job admitted behind a backlog waits for more than the Redis queue: the jobs this replica
already claimed (queued in its engine, mid-prefill, or decoding in a slot) have left the queue
but not the engine. Their prompts are prefilled before its own, and while they hold every bulk
slot it cannot start at all. In the simulator (a 5 s burst of bulk under chat, 70B on 8
H100s, `tests/bench/test_simulator.py`) a job admitted 0.65 s into the burst was predicted to
start in 0.06 s by the queue alone and started 2.0 s later (`EngineRates.bulk_start_s`).

Pure data: the dispatcher keeps the running sums (`gateway/dispatch/work_in_flight.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["InFlightWork", "NO_WORK_IN_FLIGHT"]


@dataclass(frozen=True, slots=True)
class InFlightWork:
    # Jobs held (claimed and not yet ended).
    jobs: int = 0
    # Prompt tokens of the held jobs that have made no token yet (a prompt mid-prefill counts
    # whole: the engine does not say how far it got).
    prompt_tokens: int = 0
    # Output tokens the held jobs may still make: max_tokens less what each has made.
    output_tokens: int = 0

    def __post_init__(self) -> None:
        if min(self.jobs, self.prompt_tokens, self.output_tokens) < 0:
            raise ValueError("in-flight work must be non-negative")
        if self.jobs == 0 and (self.prompt_tokens or self.output_tokens):
            raise ValueError("tokens in flight need a job in flight")


NO_WORK_IN_FLIGHT = InFlightWork()
