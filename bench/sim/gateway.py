"""The gateway's part of a simulated run: admission, the class queues, the dispatcher's claims.

The decisions are the live service's own: `policies.admission.decide_admission` with the same
`AdmissionConfig` and envelope (`gateway_envelope` for the baseline presets), the engine's rates
and the envelope's limits as the live gateway reads them (`gateway.admission.service.
engine_rates`: the simulated engine keeps the same step history and step fit), the engine's
`validate`, `policies.aging.pick_class` with the envelope's bulk offset for the claim, the
dispatcher's slots per class (interactive all of `max_active_seqs`, bulk less the reserve),
and expiry at claim of work whose deadline passed while it waited.

What is not modelled: HTTP, Redis and client latency (a claim happens at the next step
boundary, as the engine would take it then anyway); leases, reclaims and retries; several
replicas; the prompt share of queued tokens, which the live gateway estimates with a moving
average and the simulator knows exactly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.core.errors import RequestValidationError
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.sim.engine import SimulatedEngine
from gateway.admission.service import FALLBACK_INTERACTIVE_PROMPT_TOKENS, engine_rates
from gateway.dispatch.work_in_flight import WorkInFlight
from policies.admission import (
    AdmissionConfig,
    EngineRates,
    QueueState,
    RequestShape,
    decide_admission,
)
from policies.aging import ClassOffsets, pick_class
from policies.envelope import Envelope
from policies.request_class import RequestClass
from policies.scheduling_policy import NO_DEADLINE_S, SchedulingPolicy

__all__ = ["Refusal", "SimGateway", "SimJob", "admission_config"]


@dataclass(slots=True, eq=False)
class SimJob:
    """One admitted request on its way through the queue and the engine."""

    request_id: str
    request_class: RequestClass
    prompt_tokens: int
    # Made when the job is claimed: a deep backlog holds only counts, not millions of ids.
    make_prompt: Callable[[], tuple[int, ...]]
    max_tokens: int
    enqueue_s: float  # engine clock
    deadline_at_s: float  # engine clock; claimed after this, it expires instead
    # Admission's prediction, as the live gateway's x-mixgate-predicted-ttft-ms header.
    predicted_ttft_s: float | None = None
    claimed: bool = False


@dataclass(frozen=True, slots=True)
class Refusal:
    status_code: int
    code: str
    retry_after_s: float | None


@dataclass(slots=True)
class _Queue:
    jobs: deque[SimJob] = field(default_factory=deque)
    queued_tokens: int = 0
    queued_prompt_tokens: int = 0

    def add(self, job: SimJob) -> None:
        self.jobs.append(job)
        self._count(job, +1)

    def remove(self, job: SimJob) -> None:
        self.jobs.remove(job)
        self._count(job, -1)

    def pop(self) -> SimJob:
        job = self.jobs.popleft()
        self._count(job, -1)
        return job

    def _count(self, job: SimJob, sign: int) -> None:
        prompt = job.prompt_tokens
        self.queued_tokens += sign * (prompt + job.max_tokens)
        self.queued_prompt_tokens += sign * prompt


def admission_config(envelope: Envelope, policy: SchedulingPolicy) -> AdmissionConfig:
    """As gateway/http/app.py builds it."""
    return AdmissionConfig(
        interactive_ttft_target_s=envelope.interactive_ttft_target_s,
        bulk_default_deadline_s=(
            AdmissionConfig().bulk_default_deadline_s
            if policy.admits_by_deadline
            else NO_DEADLINE_S
        ),
    )


class SimGateway:
    def __init__(self, engine: SimulatedEngine, envelope: Envelope, policy: SchedulingPolicy):
        """`envelope` is what the gateway enforces (already through `gateway_envelope`)."""
        self.engine = engine
        self.envelope = envelope
        self.policy = policy
        self.config = admission_config(envelope, policy)
        self.queues = {c: _Queue() for c in RequestClass}
        self.slots = envelope.slots_by_class()
        self.in_flight = dict.fromkeys(RequestClass, 0)
        # As the live dispatcher's: what claimed jobs still have to run (admission reads bulk's).
        self.work = WorkInFlight()
        self.offsets = ClassOffsets(bulk_ms=envelope.bulk_class_offset_ms)

    # -- admission ---------------------------------------------------------------------------

    def _rates(self) -> EngineRates:
        # NOTE: a chat waiting in the engine counts as the live gateway's first guess of a
        # prompt (it keeps a moving average of admitted prompts; this one does not).
        return engine_rates(
            self.engine.load(),
            self.envelope,
            FALLBACK_INTERACTIVE_PROMPT_TOKENS,
            self.work.of(RequestClass.BULK),
        )

    def admit(
        self,
        request_id: str,
        request_class: RequestClass,
        prompt_tokens: int,
        make_prompt: Callable[[], tuple[int, ...]],
        max_tokens: int,
        deadline_s: float | None,
    ) -> SimJob | Refusal:
        """Decide and enqueue, as gateway/admission/intake.py's `admit` does."""
        if not self.policy.admits_by_deadline:
            deadline_s = None
        shape = RequestShape(request_class, prompt_tokens, max_tokens, deadline_s)
        queues = {
            c: QueueState(
                depth=len(q.jobs),
                queued_tokens=q.queued_tokens,
                queue_limit=self.envelope.queue_limit(c),
                queued_prompt_tokens=q.queued_prompt_tokens,
            )
            for c, q in self.queues.items()
        }
        decision = decide_admission(
            shape, self.envelope.length_limits_by_class(), queues, self._rates(), self.config
        )
        if decision.rejection is not None:
            rejection = decision.rejection
            return Refusal(rejection.status_code, rejection.code, rejection.retry_after_s)
        # NOTE: the engine's checks are about lengths (and ids in the vocabulary, which made-up
        # prompts are by construction), so a placeholder of the right length stands in.
        placeholder = (0,) * prompt_tokens
        try:
            self.engine.validate(
                self._generation_request(request_id, request_class, placeholder, max_tokens)
            )
        except RequestValidationError as error:
            return Refusal(
                413 if error.code == "context_length_exceeded" else 400, error.code, None
            )
        now_s = self.engine.clock()
        deadline_at_s = now_s + decision.deadline_s
        job = SimJob(
            request_id,
            request_class,
            prompt_tokens,
            make_prompt,
            max_tokens,
            now_s,
            deadline_at_s,
            predicted_ttft_s=decision.predicted_ttft_s,
        )
        self.queues[request_class].add(job)
        return job

    # -- dispatch ----------------------------------------------------------------------------

    def claim(self) -> tuple[list[SimJob], list[SimJob]]:
        """Claim while a class has a free slot: (jobs now in the engine, jobs that expired)."""
        claimed: list[SimJob] = []
        expired: list[SimJob] = []
        now_s = self.engine.clock()
        while True:
            heads = {
                c: int(q.jobs[0].enqueue_s * 1000)
                for c, q in self.queues.items()
                if q.jobs and self.in_flight[c] < self.slots[c]
            }
            request_class = pick_class(heads, self.offsets)
            if request_class is None:
                return claimed, expired
            job = self.queues[request_class].pop()
            # NOTE: integer milliseconds and a strict "<", as the claim script compares them.
            if int(job.deadline_at_s * 1000) < int(now_s * 1000):
                expired.append(job)
                continue
            job.claimed = True
            self.in_flight[request_class] += 1
            self.work.start(job.request_id, request_class, job.prompt_tokens, job.max_tokens)
            self.engine.add_request(
                self._generation_request(
                    job.request_id,
                    request_class,
                    job.make_prompt(),
                    job.max_tokens,
                    arrival_s=job.enqueue_s,
                )
            )
            claimed.append(job)

    def release(self, job: SimJob) -> None:
        """A claimed job ended (finished, cancelled or aborted): its slot is free again."""
        if job.claimed:
            job.claimed = False
            self.in_flight[job.request_class] -= 1
            self.work.end(job.request_id)

    def made_tokens(self, job: SimJob, count: int) -> None:
        """A claimed job's engine output carried `count` tokens."""
        if job.claimed:
            self.work.made_tokens(job.request_id, count)

    def cancel(self, job: SimJob) -> None:
        """The client went away: out of the queue, or aborted in the engine."""
        if job.claimed:
            self.engine.abort_request(job.request_id)
            self.release(job)
        elif job in self.queues[job.request_class].jobs:
            self.queues[job.request_class].remove(job)

    @staticmethod
    def _generation_request(
        request_id: str,
        request_class: RequestClass,
        prompt_token_ids: tuple[int, ...],
        max_tokens: int,
        arrival_s: float | None = None,
    ) -> GenerationRequest:
        # As the load generator asks: greedy, ignore_eos, so lengths are the workload's own.
        sampling = SamplingParams(
            max_tokens=max_tokens, temperature=0.0, ignore_eos=True, detokenize=False
        )
        return GenerationRequest(request_id, prompt_token_ids, sampling, request_class, arrival_s)
