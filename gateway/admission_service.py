"""Admission at the edge: read the queues and the engine's rates, ask the pure policy, enqueue.

The decision is `policies.admission.decide_admission`; this module only gathers its inputs
(queue depths from Redis, measured engine rates) and, on accept, enqueues atomically with the
class's queue bound (a queue that filled up in between still answers `queue_full`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.step_record import LoadSnapshot
from gateway.queue import AdmitStatus, NewJob, QueueDepth, QueueStore
from policies.admission import (
    AdmissionConfig,
    AdmissionDecision,
    EngineRates,
    QueueState,
    RequestShape,
    decide_admission,
)
from policies.envelope import Envelope
from policies.request_class import RequestClass

# Until the engine has measured itself (warm-up does), admission assumes these CPU-scale
# rates; they are deliberately low so that an unmeasured replica errs toward rejecting.
FALLBACK_PREFILL_TOKENS_PER_S = 500.0
FALLBACK_DECODE_TOKENS_PER_S = 50.0


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


class AdmissionService:
    def __init__(
        self,
        store: QueueStore,
        envelope: Envelope,
        config: AdmissionConfig,
        engine_load: Callable[[], LoadSnapshot | None],
    ):
        self.store = store
        self.envelope = envelope
        self.config = config
        self._engine_load = engine_load
        self._prompt_share = {c: _PromptShare() for c in RequestClass}
        self.last_depths: dict[RequestClass, QueueDepth] = {}

    def rates(self) -> EngineRates:
        load = self._engine_load()
        prefill = load.prefill_tokens_per_s if load else None
        decode = load.decode_tokens_per_s if load else None
        running = load.running_by_class if load else {}
        return EngineRates(
            prefill_tokens_per_s=prefill or FALLBACK_PREFILL_TOKENS_PER_S,
            decode_tokens_per_s=decode or FALLBACK_DECODE_TOKENS_PER_S,
            running_interactive_seqs=running.get(RequestClass.INTERACTIVE, 0),
            running_bulk_seqs=running.get(RequestClass.BULK, 0),
            measured=bool(prefill and decode),
        )

    async def decide(self, shape: RequestShape) -> AdmissionDecision:
        depths = await self.store.depths()
        self.last_depths = depths
        queues = {
            c: QueueState(
                depth=depths[c].jobs,
                queued_tokens=depths[c].queued_tokens,
                queue_limit=self.envelope.queue_limit(c),
                queued_prompt_tokens=int(depths[c].queued_tokens * self._prompt_share[c].share),
            )
            for c in RequestClass
        }
        return decide_admission(
            shape, self.envelope.length_limits_by_class(), queues, self.rates(), self.config
        )

    async def enqueue(self, job: NewJob, prompt_tokens: int) -> AdmitStatus:
        result = await self.store.admit(job)
        if result.admitted:
            self._prompt_share[job.request_class].update(prompt_tokens, job.cost_tokens)
        return result.status
