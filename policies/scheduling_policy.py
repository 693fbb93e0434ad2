"""The scheduling presets compared side by side (a small enum; the engine and gateway read it).

- `fcfs`: one queue, no classes: every request in arrival order, chunked prefill on, no bulk
  cap or share, the youngest preempted first whatever its class (like vLLM's default).
- `priority`: strict priority, interactive first; no aging, no bulk cap, no deadline admission,
  no slots kept for interactive, no preemption to admit (like vLLM's
  `--scheduling-policy priority`, which preempts only when a running request needs blocks).
- `mixgate`: everything: capped bulk prefill, aged bulk min share, interactive admission may
  preempt bulk, reserved interactive slots, deadline-aware admission, aging in the queues.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from policies.envelope import Envelope


class SchedulingPolicy(StrEnum):
    FCFS = "fcfs"
    PRIORITY = "priority"
    MIXGATE = "mixgate"

    @property
    def has_classes(self) -> bool:
        return self is not SchedulingPolicy.FCFS

    @property
    def caps_bulk_prefill(self) -> bool:
        return self is SchedulingPolicy.MIXGATE

    @property
    def ages_bulk(self) -> bool:
        return self is SchedulingPolicy.MIXGATE

    @property
    def preempts_to_admit(self) -> bool:
        return self is SchedulingPolicy.MIXGATE

    @property
    def admits_by_deadline(self) -> bool:
        return self is SchedulingPolicy.MIXGATE


# What "no admission control" and "no aging" become in the gateway's terms.
UNBOUNDED_QUEUE = 1_000_000
NO_DEADLINE_S = 1_000_000.0
# NOTE: a bulk offset of ~11.6 days: no job waits that long in a benchmark, so bulk never
# overtakes interactive in the queue, which is strict priority.
NO_AGING_OFFSET_MS = 10**12


def gateway_envelope(envelope: Envelope, policy: SchedulingPolicy) -> Envelope:
    """The envelope the gateway enforces under a preset: the baselines switch off admission by
    deadline, queue bounds, reserved interactive slots and (priority) queue aging."""
    if policy is SchedulingPolicy.MIXGATE:
        return envelope
    return replace(
        envelope,
        interactive_reserved_seqs=0,
        interactive_queue_limit=UNBOUNDED_QUEUE,
        bulk_queue_limit=UNBOUNDED_QUEUE,
        interactive_ttft_target_s=NO_DEADLINE_S,
        bulk_class_offset_ms=0 if policy is SchedulingPolicy.FCFS else NO_AGING_OFFSET_MS,
    )
