"""Admission at the edge: read the queues and the engine's rates, ask the pure policy, enqueue.

The decision is `policies.admission.decide_admission`; this module only gathers its inputs
(queue depths from Redis, measured engine rates) and, on accept, enqueues atomically with the
class's queue bound (a queue that filled up in between still answers `queue_full`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from engine.core.step_record import LoadSnapshot
from gateway.queue import AdmitResult, AdmitStatus, NewJob, QueueDepth, QueueStore
from gateway.queue.coalescer import Coalescer
from policies.admission import (
    AdmissionConfig,
    AdmissionDecision,
    EngineRates,
    QueueState,
    RequestShape,
    decide_admission,
)
from policies.envelope import Envelope
from policies.in_flight_work import NO_WORK_IN_FLIGHT, InFlightWork
from policies.request_class import RequestClass

# Until the engine has measured itself (warm-up does), admission assumes these CPU-scale
# rates; they are deliberately low so that an unmeasured replica errs toward rejecting.
FALLBACK_PREFILL_TOKENS_PER_S = 500.0
FALLBACK_DECODE_TOKENS_PER_S = 50.0
# A chat prompt's size before any was admitted (the chats: 64-256 characters + template).
FALLBACK_INTERACTIVE_PROMPT_TOKENS = 200.0
_MEAN_PROMPT_WEIGHT = 0.05


@dataclass(slots=True)
class _PromptShare:
    """Running share of prompt tokens in what a class enqueues (exponential average).

    NOTE: the queue counts prompt + max_tokens together; the policy drains prompt tokens at
    the (much faster) prefill rate, so it needs the split. An average over recent admissions
    stands in for an exact per-queue prompt counter.
    """

    share: float = 0.5
    weight: float = 0.05

    def update(self, prompt_tokens: int, cost_tokens: int) -> None:
        if cost_tokens > 0:
            self.share += self.weight * (prompt_tokens / cost_tokens - self.share)


def _prompt_part(queued_tokens: int, share: _PromptShare) -> int:
    """The estimated prompt part of a queue's tokens; at least 1 when anything is queued, since
    0 means "split unknown" to the policy."""
    if queued_tokens <= 0:
        return 0
    return min(queued_tokens, max(1, int(queued_tokens * share.share)))


def engine_rates(
    load: LoadSnapshot | None,
    envelope: Envelope,
    mean_interactive_prompt_tokens: float,
    bulk_in_flight: InFlightWork = NO_WORK_IN_FLIGHT,
) -> EngineRates:
    """What admission reads of the engine (its load snapshot), of the envelope's limits and of
    the replica's own bulk jobs in flight; the simulator's gateway (bench/sim/gateway.py)
    reads the same."""
    prefill = load.prefill_tokens_per_s if load else None
    decode = load.decode_tokens_per_s if load else None
    running = load.running_by_class if load else {}
    waiting_interactive = load.waiting_by_class.get(RequestClass.INTERACTIVE, 0) if load else 0
    slots = envelope.slots_by_class()
    return EngineRates(
        prefill_tokens_per_s=prefill or FALLBACK_PREFILL_TOKENS_PER_S,
        decode_tokens_per_s=decode or FALLBACK_DECODE_TOKENS_PER_S,
        running_interactive_seqs=running.get(RequestClass.INTERACTIVE, 0),
        running_bulk_seqs=running.get(RequestClass.BULK, 0),
        measured=bool(prefill and decode),
        # The most bulk prefill one step carries: the chunk cap, or the aged guarantee.
        bulk_step_tokens=max(
            envelope.bulk_prefill_chunk_tokens,
            math.ceil(envelope.bulk_min_share * envelope.step_token_budget),
        ),
        # The dispatcher claims interactive work while the engine has a slot for it.
        interactive_slots=slots[RequestClass.INTERACTIVE],
        waiting_interactive_prompt_tokens=round(
            waiting_interactive * mean_interactive_prompt_tokens
        ),
        recent_step_s=load.recent_step_s if load and load.recent_step_s else None,
        step_cost=load.step_cost if load else None,
        step_token_budget=envelope.step_token_budget,
        bulk_slots=slots[RequestClass.BULK],
        bulk_in_flight=bulk_in_flight,
        bulk_prefill=load.bulk_prefill if load else None,
    )


class AdmissionService:
    def __init__(
        self,
        store: QueueStore,
        envelope: Envelope,
        config: AdmissionConfig,
        engine_load: Callable[[], LoadSnapshot | None],
        bulk_in_flight: Callable[[], InFlightWork] | None = None,
    ):
        """`bulk_in_flight`: this replica's bulk jobs' work still to run (none without a
        dispatcher)."""
        self.store = store
        self.envelope = envelope
        self.config = config
        self._engine_load = engine_load
        self._bulk_in_flight = bulk_in_flight or (lambda: NO_WORK_IN_FLIGHT)
        self._prompt_share = {c: _PromptShare() for c in RequestClass}
        # Exponential average of admitted chat prompts: the size of one not yet scheduled.
        self._mean_interactive_prompt_tokens = FALLBACK_INTERACTIVE_PROMPT_TOKENS
        self.last_depths: dict[RequestClass, QueueDepth] = {}
        # Bulk intake: the admits of one tick of arrivals go to Redis in one script call.
        self._admits: Coalescer[NewJob, AdmitResult] = Coalescer(store.admit_many)

    def _count_admitted(self, request_class: RequestClass, depth: int, cost_tokens: int) -> None:
        # Keeps the depths fresh between watcher refreshes: a burst of submissions sees the
        # queue it is building, not the one of the last refresh.
        known = self.last_depths.get(request_class)
        if known is not None:
            self.last_depths[request_class] = QueueDepth(
                jobs=depth, queued_tokens=known.queued_tokens + cost_tokens
            )

    def rates(self) -> EngineRates:
        return engine_rates(
            self._engine_load(),
            self.envelope,
            self._mean_interactive_prompt_tokens,
            self._bulk_in_flight(),
        )

    async def decide(self, shape: RequestShape) -> AdmissionDecision:
        # NOTE: the Redis watcher refreshes last_depths (every redis_check_interval_s) and each
        # admit updates its class from the script's answer, so a decision reads no Redis; only
        # the first one, before the watcher's first refresh, does. The queue bound itself is
        # checked atomically by the admit script, whatever these numbers say.
        if not self.last_depths:
            self.last_depths = await self.store.depths()
        depths = self.last_depths
        queues = {
            c: QueueState(
                depth=depths[c].jobs,
                queued_tokens=depths[c].queued_tokens,
                queue_limit=self.envelope.queue_limit(c),
                queued_prompt_tokens=_prompt_part(depths[c].queued_tokens, self._prompt_share[c]),
            )
            for c in RequestClass
        }
        return decide_admission(
            shape, self.envelope.length_limits_by_class(), queues, self.rates(), self.config
        )

    async def enqueue(
        self,
        job: NewJob,
        prompt_tokens: int,
        *,
        batched: bool = False,
        admit_one: Callable[[NewJob], Awaitable[AdmitResult]] | None = None,
    ) -> AdmitStatus:
        """Admit one job; `batched` (bulk intake) shares one script call with its neighbours;
        `admit_one` replaces the store's lone admit (the dispatcher's, which may start it)."""
        if batched:
            result = await self._admits.call(job)
        else:
            result = await (admit_one or self.store.admit)(job)
        if result.admitted:
            if not result.started:  # a started job never entered the queue
                self._count_admitted(job.request_class, result.depth, job.cost_tokens)
            self._prompt_share[job.request_class].update(prompt_tokens, job.cost_tokens)
            if job.request_class is RequestClass.INTERACTIVE:
                self._mean_interactive_prompt_tokens += _MEAN_PROMPT_WEIGHT * (
                    prompt_tokens - self._mean_interactive_prompt_tokens
                )
        return result.status
