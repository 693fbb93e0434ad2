"""A load run in virtual time: the workload's arrivals, the gateway, the engine, the records.

One event loop, no sleeping, no threads, no asyncio. Time moves only when the engine steps
(by the cost model's estimate of the step) or, when it has nothing to do, by jumping to the
next arrival. Arrivals that fall inside a step are admitted at their own times once the step
is over; claims happen at step boundaries, where the live engine would take the work anyway.

The run mirrors the load generator (bench/loadgen*.py): the same planned requests
(`plan_open_loop`, `ClosedLoopSource`), the same cancellations, the run ending `drain_s` after
the workload's duration with what is left recorded incomplete, metrics sampled every
`metrics_interval_s`, and one `RequestRecord` per request with TTFT/ITL/outcome.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy

from bench.load.records import (
    CANCELLED,
    ERROR,
    EXPIRED,
    INCOMPLETE,
    OK,
    REJECTED,
    MetricSample,
    RequestRecord,
)
from bench.load.workload import (
    ClosedLoopSource,
    PlannedRequest,
    Workload,
    plan_open_loop,
    request_rng,
)
from bench.sim.gateway import Refusal, SimGateway, SimJob
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.sim.engine import SimulatedEngine
from policies.request_class import RequestClass

__all__ = ["SimResult", "prompt_token_ids", "simulate_load", "warm_up"]

# As the load generator: a client planned to give up "before the first token" waits this long.
_CANCEL_BEFORE_FIRST_TOKEN_MAX_S = 0.05


@dataclass(frozen=True, slots=True)
class SimResult:
    records: list[RequestRecord]
    samples: list[MetricSample]
    duration_s: float  # virtual seconds, drain included (as a live run's wall time)
    issued: list[PlannedRequest]


def prompt_token_ids(seed: int, planned: PlannedRequest, vocab_size: int) -> tuple[int, ...]:
    """A request's prompt: seeded random ids, distinct per request (no prefix-cache hits,
    as the load generator's random words ensure on a live server)."""
    key = f"{seed}:{planned.request_class.value}:prompt:{planned.index}".encode()
    # NOTE: numpy draws a 2k-token prompt ~50x faster than random.choices; sha256 keeps the
    # seed stable across processes.
    rng = numpy.random.default_rng(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))
    return tuple(rng.integers(0, vocab_size, planned.prompt_tokens).tolist())


def warm_up(engine: SimulatedEngine) -> None:
    """What gateway/runtime/engine_setup.py's start_engine does before serving: four short bulk
    requests, so admission starts from measured (here: simulated) rates."""
    prompt = tuple(range(1, 1 + min(64, engine.max_model_len // 4)))
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, detokenize=False)
    for index in range(4):
        engine.add_request(
            GenerationRequest(f"warmup-{index}", prompt, sampling, RequestClass.BULK)
        )
    while engine.has_unfinished_requests():
        engine.step()


@dataclass(slots=True, eq=False)
class _Live:
    """A request the client still waits on."""

    planned: PlannedRequest
    record: RequestRecord
    source: ClosedLoopSource | None
    job: SimJob | None = None
    last_token_s: float | None = None
    tokens: int = 0


@dataclass(order=True, slots=True)
class _Event:
    at_s: float
    order: int
    kind: str = field(compare=False)  # "send" | "cancel"
    planned: PlannedRequest | None = field(compare=False, default=None)
    source: ClosedLoopSource | None = field(compare=False, default=None)
    request_id: str = field(compare=False, default="")


class _Loop:
    def __init__(
        self,
        workload: Workload,
        engine: SimulatedEngine,
        gateway: SimGateway,
        drain_s: float,
        metrics_interval_s: float,
    ) -> None:
        self.workload = workload
        self.engine = engine
        self.gateway = gateway
        self.end_s = workload.duration_s + drain_s
        self.interval_s = metrics_interval_s
        self.t0 = engine.clock()
        self.events: list[_Event] = []
        self._order = itertools.count()
        self.live: dict[str, _Live] = {}
        self.finished: list[RequestRecord] = []
        self.samples: list[MetricSample] = []
        self.issued: list[PlannedRequest] = []
        self._next_sample_s = 0.0

    def now_s(self) -> float:
        return self.engine.clock() - self.t0

    def reached(self, at_s: float) -> bool:
        """Whether run time `at_s` has come. NOTE: the clock is absolute (t0 + at_s), and
        (t0 + at_s) - t0 can round below at_s: a plain `<=` then never fires the event that the
        idle jump advanced to, and the loop jumps to the same instant forever (it hung a
        seed of the simulated compare). Half a nanosecond of slack absorbs the rounding."""
        return at_s <= self.now_s() + 5e-10

    def push(self, at_s: float, kind: str, **payload: Any) -> None:
        heapq.heappush(self.events, _Event(at_s, next(self._order), kind, **payload))

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> float:
        for planned in plan_open_loop(self.workload):
            self.push(planned.at_s, "send", planned=planned)
        for cls, load in self.workload.classes.items():
            if load.arrival.kind == "closed":
                source = ClosedLoopSource(self.workload, cls)
                for _ in range(load.arrival.concurrency):
                    self.push(0.0, "send", source=source)
        while True:
            self._handle_due()
            self._sample()
            if self.reached(self.end_s):
                break
            expired_or_claimed = self.gateway.claim()
            self._on_claims(*expired_or_claimed)
            if self.engine.has_unfinished_requests():
                before_s = self.engine.clock()
                outputs = self.engine.step()
                self._on_outputs(outputs)
                if outputs or self.engine.clock() > before_s:
                    continue
            # Idle (or stuck until something arrives): jump to the next event.
            if not self.events:
                break
            self.engine.virtual_clock.advance_to(self.t0 + min(self.events[0].at_s, self.end_s))
        return max(self.workload.duration_s, min(self.now_s(), self.end_s))

    def _handle_due(self) -> None:
        while self.events and self.reached(self.events[0].at_s):
            event = heapq.heappop(self.events)
            if event.kind == "cancel":
                self._cancel_due(event.request_id)
            elif event.planned is not None:
                self._send(event.planned, None, event.at_s)
            elif event.source is not None and event.at_s < self.workload.duration_s:
                self._send(event.source.next_request(event.at_s), event.source, event.at_s)

    def _sample(self) -> None:
        now_s = self.now_s()
        if now_s < self._next_sample_s:
            return
        engine, queues = self.engine, self.gateway.queues
        self.samples.append(
            MetricSample(
                t_s=self._next_sample_s,
                queue_depth={c.value: float(len(q.jobs)) for c, q in queues.items()},
                queued_tokens={c.value: float(q.queued_tokens) for c, q in queues.items()},
                running={c.value: float(engine.scheduler.num_running(c)) for c in RequestClass},
                kv_usage=engine.block_manager.usage,
                preemptions=float(engine.history.total_preemptions),
                steps=float(engine.history.total_steps),
            )
        )
        # Ticks a long step or an idle jump skipped are not back-filled (a gap, as a live
        # scrape that overran its interval).
        self._next_sample_s = (int(now_s / self.interval_s) + 1) * self.interval_s

    # -- requests ----------------------------------------------------------------------------

    def _send(self, planned: PlannedRequest, source: ClosedLoopSource | None, at_s: float) -> None:
        self.issued.append(planned)
        cls = planned.request_class
        record = RequestRecord(
            request_id=f"{cls.value}-{planned.index}",
            request_class=cls.value,
            prompt_tokens=planned.prompt_tokens,
            max_tokens=planned.max_tokens,
            scheduled_s=planned.at_s,
            sent_s=at_s,
            cancel_plan=planned.cancel.when if planned.cancel is not None else None,
        )
        live = _Live(planned, record, source)
        vocab, seed = self.engine.model_config.vocab_size, self.workload.seed
        answer = self.gateway.admit(
            record.request_id,
            cls,
            planned.prompt_tokens,
            lambda: prompt_token_ids(seed, planned, vocab),
            planned.max_tokens,
            planned.deadline_s,
        )
        if isinstance(answer, Refusal):
            record.status_code, record.error_code = answer.status_code, answer.code
            record.outcome = REJECTED if answer.status_code == 429 else ERROR
            record.retry_after_s = answer.retry_after_s
            # As the load generator: a closed-loop client waits out Retry-After. NOTE: 1 ms
            # after other refusals (413) where it waits 0: a workload whose every request is
            # refused would otherwise loop forever at one instant of virtual time.
            rejected = record.outcome == REJECTED
            self._finish(live, pause_s=(answer.retry_after_s or 1.0) if rejected else 0.001)
            return
        record.status_code = 200 if cls is RequestClass.INTERACTIVE else 202
        record.predicted_ttft_s = answer.predicted_ttft_s
        live.job = answer
        self.live[record.request_id] = live
        cancel = planned.cancel
        if cancel is not None and cancel.when == "before_first_token":
            if cls is RequestClass.BULK:
                self._cancel_due(record.request_id)  # the load generator DELETEs at once
            else:
                rng = request_rng(self.workload.seed, cls, planned.index)
                delay_s = rng.uniform(0.0, _CANCEL_BEFORE_FIRST_TOKEN_MAX_S)
                self.push(at_s + delay_s, "cancel", request_id=record.request_id)

    def _cancel_due(self, request_id: str) -> None:
        live = self.live.get(request_id)
        if live is None:
            return  # already over
        if live.job is not None:
            self.gateway.cancel(live.job)
        live.record.outcome = CANCELLED
        live.record.output_tokens = live.tokens
        self._finish(live)

    def _on_claims(self, claimed: list[SimJob], expired: list[SimJob]) -> None:
        for job in expired:
            live = self.live[job.request_id]
            live.record.outcome, live.record.error_code = EXPIRED, "deadline_expired"
            self._finish(live)
        for job in claimed:
            live = self.live[job.request_id]
            cancel = live.planned.cancel
            # A bulk client planned to cancel mid-run DELETEs once it sees the job running.
            if (
                cancel is not None
                and cancel.when == "mid_stream"
                and job.request_class is RequestClass.BULK
            ):
                self._cancel_due(job.request_id)

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        now_s = self.now_s()
        for output in outputs:
            live = self.live.get(output.request_id)
            if live is None:
                continue  # warm-up, or aborted in the same step
            self._on_tokens(live, len(output.new_token_ids), now_s)
            if live.job is not None and output.new_token_ids:
                self.gateway.made_tokens(live.job, len(output.new_token_ids))
            if output.finished:
                self._completed(live, output, now_s)
            elif self._cancel_now(live):
                self._cancel_due(output.request_id)

    def _on_tokens(self, live: _Live, count: int, now_s: float) -> None:
        record = live.record
        for _ in range(count):
            if live.last_token_s is None:
                if record.request_class == RequestClass.INTERACTIVE.value:
                    record.ttft_s = now_s - record.sent_s
            elif record.request_class == RequestClass.INTERACTIVE.value:
                record.itls_s.append(now_s - live.last_token_s)
            live.last_token_s = now_s
            live.tokens += 1

    @staticmethod
    def _cancel_now(live: _Live) -> bool:
        cancel = live.planned.cancel
        return (
            cancel is not None
            and cancel.when == "mid_stream"
            and live.planned.request_class is RequestClass.INTERACTIVE
            and live.tokens >= cancel.after_tokens
        )

    def _completed(self, live: _Live, output: RequestOutput, now_s: float) -> None:
        record = live.record
        record.outcome = OK
        record.output_tokens = output.num_output_tokens
        metrics = output.metrics
        if metrics is not None:
            record.queue_delay_s = metrics.queue_delay_s
            if record.request_class == RequestClass.BULK.value:
                # Jobs report server-side timings, from admission (as the live job API does).
                record.ttft_s, record.e2e_s = metrics.ttft_s, metrics.e2e_s
        if record.e2e_s is None:
            record.e2e_s = now_s - record.sent_s
        if self._cancel_now(live):
            record.outcome = CANCELLED  # the last token was also the one it gave up at
        self._finish(live)

    def _finish(self, live: _Live, pause_s: float = 0.0) -> None:
        self.live.pop(live.record.request_id, None)
        if live.job is not None:
            self.gateway.release(live.job)
        self.finished.append(live.record)
        if live.source is not None:
            self.push(self.now_s() + pause_s, "send", source=live.source)

    def abandon(self) -> None:
        """What is still queued or running when the run ends is incomplete."""
        for live in list(self.live.values()):
            if live.job is not None:
                self.gateway.cancel(live.job)
            live.record.outcome = INCOMPLETE
            live.record.output_tokens = live.tokens
            self.live.pop(live.record.request_id)
            self.finished.append(live.record)


def simulate_load(
    workload: Workload,
    engine: SimulatedEngine,
    gateway: SimGateway,
    *,
    drain_s: float = 10.0,
    metrics_interval_s: float = 1.0,
) -> SimResult:
    """Run `workload` through `gateway` into `engine` (warmed up already) in virtual time."""
    if not drain_s >= 0:
        raise ValueError(f"drain_s: must be >= 0, got {drain_s!r}")
    if not metrics_interval_s > 0:
        raise ValueError(f"metrics_interval_s: must be > 0, got {metrics_interval_s!r}")
    loop = _Loop(workload, engine, gateway, drain_s, metrics_interval_s)
    duration_s = loop.run()
    loop.abandon()
    records = sorted(loop.finished, key=lambda rec: (rec.sent_s, rec.request_id))
    return SimResult(records, loop.samples, duration_s, loop.issued)
