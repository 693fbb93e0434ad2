"""Admission: accept a request only if it fits the length limits, its queue, and its deadline.

The decision is an *estimate*, made before any work is queued, so that a request the service
cannot serve in time is refused at once (429 + Retry-After) instead of timing out in a queue.

Model (every assumption here is optimistic or pessimistic on purpose, and says which):

- The engine drains queued work at the rates in ``EngineRates``. Until the engine has measured
  them they come from the cost model (``planning/costmodel.py``), which is optimistic; once
  measured rates exist the gateway passes those instead (``EngineRates.measured``).
- Classes are served in strict priority, and an interactive request overtakes every bulk
  request, queued or running (the scheduler gives interactive prefill the step budget before
  bulk prefill and preempts bulk to make room). So an interactive request's predicted TTFT
  counts only what it cannot overtake (``_interactive_start_s``):

  1. the step in flight when it arrives, bounded by one bulk chunk
     (``EngineRates.bulk_step_tokens`` at the prefill rate), when any bulk work exists;
  2. the interactive prefill queued ahead of it (FCFS inside the class): the queue's prompt
     tokens, plus those claimed into the engine and not yet scheduled, at the prefill rate
     (their decodes run beside its prefill, they do not delay its first token);
  3. only when interactive work fills every interactive slot: the output tokens queued ahead,
     shared among the slots, one token per slot per step;
  4. its own prompt, at the prefill rate.

  The measured prefill rate charges whole mixed steps (every running sequence's decode
  included) to the prefill tokens in them, so under a bulk backlog it is several times slower
  than what one more chat prompt costs in a step: that margin covers the bulk chunk that may
  ride along in the request's own prefill step, which is not counted again.
- A bulk request waits for the interactive queue and its own queue to drain
  (``EngineRates.drain_s``). Where the engine's steps have been fit as fixed + per-token costs
  (``EngineRates.step_cost``, ``policies/step_cost.py``), a queue drains in the steps its
  slower side needs at the class's per-step limits (prefill chunk, sequences), prefill and
  decode sharing those steps. Otherwise queued prompt tokens cost the prefill rate and queued
  output tokens (``max_tokens``, an upper bound) the aggregate decode rate, one after the
  other: pessimistic, several times over under a backlog. When a queue does not know its
  prompt share (``queued_prompt_tokens == 0``), everything costs output tokens: pessimistic.
  Interactive prediction needs the share (the admission service estimates it).
  A bulk request also waits for this replica's own bulk jobs in flight, which left the queue
  when they were claimed: their prompts not yet prefilled, and, while they hold every bulk
  slot, the decodes that free one (``EngineRates.bulk_start_s``,
  ``policies/in_flight_work.py``). Other replicas' jobs in flight are not counted: they run on
  other engines.
- A new sequence joins the running batch at a step boundary, so (with a slot free) the work
  left in running sequences does not delay its start; it then makes one token a step, at the
  engine's recent step time (``EngineRates.per_sequence_token_s``). Until steps are measured
  it shares the decode rate with them, at ``decode_tokens_per_s / (running + 1)`` per
  sequence, which assumes the aggregate does not grow when it joins: pessimistic where decode
  is memory-bound.
  (Under `mixed`'s backlog a bulk job made a token every 28 ms on vLLM and 12 ms on the native
  engine, about one a step: `bench breakdown`'s records.)
- ``safety_factor`` (>= 1) scales predictions before they are compared with a deadline, to
  cover what the estimate omits. The decision reports the unscaled predictions.
- Arrivals after this request are ignored: new interactive work can still overtake bulk.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.admission_decision import AdmissionDecision, Rejection
from policies.engine_rates import EngineRates
from policies.queue_state import QueueState
from policies.request_class import RequestClass
from policies.validation import require_positive_finite

__all__ = [
    "AdmissionConfig",
    "AdmissionDecision",
    "EngineRates",
    "LengthLimits",
    "QueueState",
    "Rejection",
    "RequestShape",
    "decide_admission",
]


@dataclass(frozen=True, slots=True)
class RequestShape:
    request_class: RequestClass
    prompt_tokens: int
    max_tokens: int  # the output bound (OpenAI's max_tokens / max_completion_tokens)
    # Relative seconds from now: interactive -> by when the first token must arrive; bulk -> by
    # when the job must finish. None: the class default from AdmissionConfig.
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError("prompt_tokens must be at least 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1 (the request schema rejects less)")
        if self.deadline_s is not None:
            require_positive_finite("deadline_s", self.deadline_s)


@dataclass(frozen=True, slots=True)
class LengthLimits:
    """Request length limits for one class (part of the operating envelope)."""

    max_prompt_tokens: int
    max_output_tokens: int
    max_context_tokens: int  # prompt + max_tokens

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_output_tokens", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_prompt_tokens > self.max_context_tokens:
            raise ValueError("max_prompt_tokens must not exceed max_context_tokens")
        if self.max_output_tokens > self.max_context_tokens:
            raise ValueError("max_output_tokens must not exceed max_context_tokens")


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    interactive_ttft_target_s: float = 2.0  # TTFT deadline when the request sets none
    bulk_default_deadline_s: float = 3600.0  # completion deadline when the job sets none
    # NOTE: 1.25, not 1: the cost model omits overheads, so unscaled predictions would admit
    # work that then misses its deadline; measured rates make a smaller factor reasonable.
    safety_factor: float = 1.25

    def __post_init__(self) -> None:
        require_positive_finite("interactive_ttft_target_s", self.interactive_ttft_target_s)
        require_positive_finite("bulk_default_deadline_s", self.bulk_default_deadline_s)
        if not (math.isfinite(self.safety_factor) and self.safety_factor >= 1.0):
            raise ValueError(f"safety_factor must be finite and >= 1, got {self.safety_factor}")


def _length_rejection(shape: RequestShape, limits: LengthLimits) -> Rejection | None:
    cls = shape.request_class.value
    if shape.prompt_tokens > limits.max_prompt_tokens:
        return Rejection.too_long(
            "prompt_too_long",
            f"The prompt has {shape.prompt_tokens} tokens; {cls} requests allow at most "
            f"{limits.max_prompt_tokens}.",
            "messages",
        )
    if shape.max_tokens > limits.max_output_tokens:
        return Rejection.too_long(
            "max_tokens_too_large",
            f"max_tokens is {shape.max_tokens}; {cls} requests allow at most "
            f"{limits.max_output_tokens}.",
            "max_tokens",
        )
    context_tokens = shape.prompt_tokens + shape.max_tokens
    if context_tokens > limits.max_context_tokens:
        return Rejection.too_long(
            "context_length_exceeded",
            f"The prompt ({shape.prompt_tokens} tokens) plus max_tokens ({shape.max_tokens}) "
            f"is {context_tokens} tokens; {cls} requests allow at most "
            f"{limits.max_context_tokens}.",
            "messages",
        )
    return None


def _bulk_chunk_s(queues: Mapping[RequestClass, QueueState], rates: EngineRates) -> float:
    """The time of one step's bulk chunk, when there is bulk work to fill one (else 0)."""
    bulk_present = rates.running_bulk_seqs > 0 or queues[RequestClass.BULK].depth > 0
    return rates.bulk_step_tokens / rates.prefill_tokens_per_s if bulk_present else 0.0


def _interactive_start_s(queue: QueueState, rates: EngineRates, bulk_chunk_s: float) -> float:
    """When an interactive request's prefill can start: only what it cannot overtake.

    (1)-(3) of the module docstring: the step in flight (one bulk chunk), the interactive
    prefill ahead, and, only when interactive work holds every interactive slot, the output
    queued ahead shared among the slots at one token per slot per step.
    """
    # NOTE: the prompt share as given, 0 included: reading an unknown split as "all prompt"
    # would make the prediction jump down when one prompt token becomes known, breaking
    # monotonicity in the queue. The admission service always passes its estimate.
    prompt_ahead = queue.queued_prompt_tokens + rates.waiting_interactive_prompt_tokens
    prefill_ahead_s = prompt_ahead / rates.prefill_tokens_per_s
    slots = rates.interactive_slots
    slot_wait_s = 0.0
    if slots and rates.running_interactive_seqs + queue.depth >= slots:
        output_ahead = queue.queued_tokens - queue.queued_prompt_tokens
        slot_wait_s = output_ahead / slots * rates.per_sequence_token_s
    return bulk_chunk_s + prefill_ahead_s + slot_wait_s


def _retry_after_s(predicted_wait_s: float, safety_factor: float) -> int:
    # Whole seconds (the Retry-After header's unit), rounded up, never 0: "retry at once"
    # would invite a tight retry loop against a queue that has not moved.
    return max(1, math.ceil(predicted_wait_s * safety_factor))


def decide_admission(
    shape: RequestShape,
    limits: Mapping[RequestClass, LengthLimits],
    queues: Mapping[RequestClass, QueueState],
    rates: EngineRates,
    cfg: AdmissionConfig,
) -> AdmissionDecision:
    """Accept, or reject with an HTTP status, an OpenAI error code and a reason.

    Checks, in order: length limits (413/400), queue full (429 ``queue_full``), deadline
    (429 ``deadline_unmeetable``). Predictions are always computed, so every decision, accept
    or reject, can be logged with the numbers behind it.

    ``retry_after_s`` (429 only) is the predicted time, scaled by ``safety_factor`` and rounded
    up to whole seconds (at least 1), for the work ahead to drain far enough:

    - ``queue_full``: the queue must shed ``excess = depth - queue_limit + 1`` entries. At the
      queue's average entry size that takes ``excess / depth`` of its drain time, plus (bulk)
      the interactive work ahead, which is served first.
    - ``deadline_unmeetable``: the predicted start must drop to ``deadline / safety_factor -
      own_s`` (``own_s``: own prefill for interactive, own prefill + decode for bulk), which
      takes ``start - max(0, that)`` seconds of draining. If the deadline is missed even with
      nothing queued ahead, only a lighter running load can help; the answer is then 1 s.
    """
    cls = shape.request_class
    missing = [c.value for c in RequestClass if c not in queues] + (
        [] if cls in limits else [f"limits[{cls.value}]"]
    )
    if missing:
        # A missing queue read as empty would understate the wait: refuse to guess.
        raise ValueError(f"decide_admission needs entries for: {', '.join(missing)}")
    own_queue = queues[cls]

    # Work ahead: its own class, and for bulk also the interactive queue served before it.
    ahead_other_s = 0.0
    prefill_s = shape.prompt_tokens / rates.prefill_tokens_per_s
    if cls is RequestClass.BULK:
        if rates.bulk_prefill is not None:
            prefill_s = rates.bulk_prefill.drain_s(shape.prompt_tokens, 0, 0)
        ahead_other_s = rates.drain_s(queues[RequestClass.INTERACTIVE], RequestClass.INTERACTIVE)
        start_s = ahead_other_s + rates.bulk_start_s(own_queue)
    else:
        start_s = _interactive_start_s(own_queue, rates, _bulk_chunk_s(queues, rates))
    ttft_s = start_s + prefill_s
    finish_s = ttft_s + shape.max_tokens * rates.per_sequence_token_s

    interactive = cls is RequestClass.INTERACTIVE
    default_deadline_s = (
        cfg.interactive_ttft_target_s if interactive else cfg.bulk_default_deadline_s
    )
    deadline_s = shape.deadline_s if shape.deadline_s is not None else default_deadline_s

    def decision(rejection: Rejection | None) -> AdmissionDecision:
        return AdmissionDecision(
            request_class=cls,
            predicted_start_s=start_s,
            predicted_ttft_s=ttft_s,
            predicted_finish_s=finish_s,
            deadline_s=deadline_s,
            rates_measured=rates.measured,
            rejection=rejection,
        )

    length_rejection = _length_rejection(shape, limits[cls])
    if length_rejection is not None:
        return decision(length_rejection)

    if own_queue.depth >= own_queue.queue_limit:
        excess = own_queue.depth - own_queue.queue_limit + 1
        wait_s = ahead_other_s + rates.drain_s(own_queue, cls) * excess / own_queue.depth
        return decision(
            Rejection.overloaded(
                "queue_full",
                f"The {cls.value} queue is full ({own_queue.depth} of {own_queue.queue_limit} "
                "pending).",
                _retry_after_s(wait_s, cfg.safety_factor),
            )
        )

    # What the deadline bounds: the first token (interactive) or the whole job (bulk).
    bounded_s = ttft_s if interactive else finish_s
    if bounded_s * cfg.safety_factor > deadline_s:
        own_s = bounded_s - start_s
        target_start_s = max(0.0, deadline_s / cfg.safety_factor - own_s)
        what = "first token" if interactive else "completion"
        return decision(
            Rejection.overloaded(
                "deadline_unmeetable",
                f"Predicted {what} in {bounded_s:.3f} s (x{cfg.safety_factor:g} safety factor) "
                f"misses the {deadline_s:.3f} s deadline; {start_s:.3f} s of queued work is "
                "ahead.",
                _retry_after_s(start_s - target_start_s, cfg.safety_factor),
            )
        )
    return decision(None)
