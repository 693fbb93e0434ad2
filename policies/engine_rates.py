"""What admission knows of the engine: its measured rates and limits, and the work a queue
ahead of a new request takes to drain at them (`policies/admission.py` decides with it).

The engine's measured prefill and decode rates, its step-cost fit (`policies/step_cost.py`),
its bulk prefill pace (`policies/bulk_prefill_pace.py`), the per-class limits of a step from
the envelope, and this replica's bulk jobs in flight (`policies/in_flight_work.py`).

Pure arithmetic: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.bulk_prefill_pace import BulkPrefillPace
from policies.in_flight_work import NO_WORK_IN_FLIGHT, InFlightWork
from policies.queue_state import QueueState
from policies.request_class import RequestClass
from policies.step_cost import StepCost
from policies.validation import require_positive_finite

__all__ = ["EngineRates"]


@dataclass(frozen=True, slots=True)
class EngineRates:
    prefill_tokens_per_s: float  # prompt tokens the engine processes per second
    decode_tokens_per_s: float  # output tokens per second, all running sequences together
    running_interactive_seqs: int
    running_bulk_seqs: int
    measured: bool  # True: measured by the engine; False: the cost model's estimate
    # The most bulk prefill tokens one step carries (the envelope's bulk chunk, or the aged
    # bulk guarantee if larger): what bounds the step an interactive request cannot cut short.
    bulk_step_tokens: int = 0
    # Sequences the interactive class may run at once (0: no bound known).
    interactive_slots: int = 0
    # Prompt tokens of interactive sequences in the engine that are not yet scheduled.
    waiting_interactive_prompt_tokens: int = 0
    # The engine's recent step time (None until measured): a running sequence's time per token.
    recent_step_s: float | None = None
    # The engine's steps fit as fixed + per-token costs (None until separable), and the per-step
    # limits a queue drains at by it (0: unknown): the step budget, bulk's sequences.
    step_cost: StepCost | None = None
    step_token_budget: int = 0
    bulk_slots: int = 0
    # What this replica's own bulk jobs still have to run (claimed, so out of the queue).
    bulk_in_flight: InFlightWork = NO_WORK_IN_FLIGHT
    # How fast bulk prefill went while bulk had prompts (None until measured): what a bulk
    # backlog drains at (`policies/bulk_prefill_pace.py`).
    bulk_prefill: BulkPrefillPace | None = None

    def __post_init__(self) -> None:
        require_positive_finite("prefill_tokens_per_s", self.prefill_tokens_per_s)
        require_positive_finite("decode_tokens_per_s", self.decode_tokens_per_s)
        if self.running_interactive_seqs < 0 or self.running_bulk_seqs < 0:
            raise ValueError("running sequence counts must be non-negative")
        if min(self.bulk_step_tokens, self.interactive_slots) < 0:
            raise ValueError("bulk_step_tokens and interactive_slots must be non-negative")
        if min(self.step_token_budget, self.bulk_slots) < 0:
            raise ValueError("step_token_budget and bulk_slots must be non-negative")
        if self.waiting_interactive_prompt_tokens < 0:
            raise ValueError("waiting_interactive_prompt_tokens must be non-negative")
        if self.recent_step_s is not None:
            require_positive_finite("recent_step_s", self.recent_step_s)

    @property
    def per_sequence_token_s(self) -> float:
        """Seconds between two tokens of one running sequence: it gets one token per step."""
        if self.recent_step_s is not None:
            return self.recent_step_s
        return 1.0 / self.per_sequence_decode_tokens_per_s

    @property
    def per_sequence_decode_tokens_per_s(self) -> float:
        """The decode rate one more sequence would get: an equal share with those running."""
        sharing_seqs = self.running_interactive_seqs + self.running_bulk_seqs + 1
        return self.decode_tokens_per_s / sharing_seqs

    def drain_s(self, queue: QueueState, request_class: RequestClass) -> float:
        """Seconds to process a class's queued work at these rates (`policies/admission.py`'s
        docstring): bulk's at the measured bulk pace where there is one (`bulk_work_s`)."""
        output_tokens = queue.queued_tokens - queue.queued_prompt_tokens
        if request_class is RequestClass.BULK:
            return self.bulk_work_s(queue.queued_prompt_tokens, output_tokens)
        return self.work_s(queue.queued_prompt_tokens, output_tokens, request_class)

    def bulk_start_s(self, queue: QueueState) -> float:
        """Seconds until a bulk job admitted now starts its prefill, behind the bulk queue and
        this replica's bulk jobs in flight (`policies/in_flight_work.py`), at the bulk
        prefill pace the engine measured, else by the step fit or the per-kind rates.

        Every prompt ahead is prefilled first (FCFS in the class). A slot must also be free:
        of the jobs ahead, all but the `bulk_slots - 1` that may still run beside it must have
        finished decoding, so that share of the output ahead (the average job's) bounds the
        start, and the rest only rides along in the same steps. A queue shorter than the free
        slots waits for prompts only."""
        flight = self.bulk_in_flight
        jobs = queue.depth + flight.jobs
        prompt_tokens = queue.queued_prompt_tokens + flight.prompt_tokens
        output_tokens = queue.queued_tokens - queue.queued_prompt_tokens + flight.output_tokens
        bounding_tokens = output_tokens
        if self.bulk_slots and jobs:
            done_before = max(0, jobs - (self.bulk_slots - 1))
            bounding_tokens = output_tokens * done_before // jobs
        return self.bulk_work_s(
            prompt_tokens, bounding_tokens, output_tokens_beside=output_tokens - bounding_tokens
        )

    def bulk_work_s(
        self, prompt_tokens: int, output_tokens: int, *, output_tokens_beside: int = 0
    ) -> float:
        """Seconds to run bulk prefill and decode work: at the measured bulk prefill pace,
        else by `work_s` (`output_tokens_beside` as there; the pace has them in its steps)."""
        if self.bulk_prefill is not None:
            return self.bulk_prefill.drain_s(prompt_tokens, output_tokens, self.bulk_slots)
        return self.work_s(
            prompt_tokens,
            output_tokens,
            RequestClass.BULK,
            output_tokens_beside=output_tokens_beside,
        )

    def work_s(
        self,
        prompt_tokens: int,
        output_tokens: int,
        request_class: RequestClass,
        *,
        output_tokens_beside: int = 0,
    ) -> float:
        """Seconds to run a class's prefill and decode work, by the step fit where there is
        one (its per-step limits), else the per-kind rates one after the other.
        `output_tokens_beside`: decodes that share those steps without bounding them (the fit
        counts their per-token part; the per-kind rates leave them out, as they overlap)."""
        bulk = request_class is RequestClass.BULK
        prefill_per_step = (self.bulk_step_tokens if bulk else 0) or self.step_token_budget
        seqs_per_step = self.bulk_slots if bulk else self.interactive_slots
        if self.step_cost is not None and prefill_per_step and seqs_per_step:
            return self.step_cost.drain_s(
                prompt_tokens,
                output_tokens,
                prefill_tokens_per_step=prefill_per_step,
                seqs_per_step=seqs_per_step,
                output_tokens_beside=output_tokens_beside,
            )
        return prompt_tokens / self.prefill_tokens_per_s + output_tokens / self.decode_tokens_per_s
