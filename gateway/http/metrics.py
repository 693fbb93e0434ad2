"""Prometheus metrics, with a `class` label wherever the traffic class applies.

Request-path counters and latency histograms are updated as things happen; engine and queue
gauges are read at scrape time from the engine's load snapshot and the last queue depths, so a
scrape never waits on Redis.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.core.step_record import LoadSnapshot, StepRecord
from gateway.admission.intake_lane import IntakeLane
from gateway.http.metrics_dispatch import (
    DispatchCollector,
    IntakeCollector,
    LocalJobsCollector,
    LocalJobsView,
)
from policies.request_class import RequestClass

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LOOP_LAG_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
# The loop-lag probe sleeps this long and records how much later than asked it woke up.
LOOP_LAG_PROBE_INTERVAL_S = 0.01

__all__ = ["LocalJobsView", "Metrics", "engine_step_records"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "mixgate_requests_total",
            "Requests by class, endpoint and outcome",
            ["class", "endpoint", "outcome"],
            registry=self.registry,
        )
        self.rejections = Counter(
            "mixgate_admission_rejections_total",
            "Requests rejected at admission, by code",
            ["class", "code"],
            registry=self.registry,
        )
        self.jobs_finished = Counter(
            "mixgate_jobs_finished_total",
            "Jobs this replica ran to a terminal status",
            ["class", "status"],
            registry=self.registry,
        )
        self.ttft_s = Histogram(
            "mixgate_ttft_seconds",
            "Time to first token, from admission",
            ["class"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.itl_s = Histogram(
            "mixgate_itl_seconds",
            "Inter-token latency",
            ["class"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.e2e_s = Histogram(
            "mixgate_e2e_seconds",
            "End-to-end time, from admission to the last token",
            ["class"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_delay_s = Histogram(
            "mixgate_queue_delay_seconds",
            "Time from admission to the first engine step",
            ["class"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

        self.loop_lag_s = Histogram(
            "mixgate_event_loop_lag_seconds",
            f"How late a {LOOP_LAG_PROBE_INTERVAL_S * 1000:g} ms sleep on the event loop wakes",
            buckets=LOOP_LAG_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_RuntimeCollector())

    async def probe_loop_lag(self, interval_s: float = LOOP_LAG_PROBE_INTERVAL_S) -> None:
        """Forever: sleep `interval_s`, observe how late the wake-up came. Whatever holds the
        loop (a handler's CPU work, the engine thread holding the GIL) shows up here; it is
        the delay every ready task, a token waiting to be written included, sees."""
        loop = asyncio.get_running_loop()
        while True:
            asked_s = loop.time() + interval_s
            await asyncio.sleep(interval_s)
            self.loop_lag_s.observe(max(0.0, loop.time() - asked_s))

    def observe_timings(self, request_class: RequestClass, timings: dict[str, object]) -> None:
        label = request_class.value
        for key, histogram in (
            ("ttft_s", self.ttft_s),
            ("e2e_s", self.e2e_s),
            ("queue_s", self.queue_delay_s),
        ):
            value = timings.get(key)
            if isinstance(value, int | float):
                histogram.labels(label).observe(max(0.0, float(value)))
        itls = timings.get("itls_s")
        if isinstance(itls, list):
            for itl in itls:
                self.itl_s.labels(label).observe(max(0.0, float(itl)))

    def watch(
        self,
        engine_load: Callable[[], LoadSnapshot | None],
        queue_depths: Callable[[], dict[RequestClass, tuple[int, int]]],
        step_records: Callable[[], Sequence[StepRecord]] | None = None,
        dispatch_events: Callable[[], Mapping[tuple[str, RequestClass], int]] | None = None,
    ) -> None:
        """Register the scrape-time collectors over the engine, the queues and (when given)
        the engine's recent step records and the dispatcher's event totals."""
        self.registry.register(_StateCollector(engine_load, queue_depths))
        if step_records is not None:
            self.registry.register(_StepCollector(step_records))
        if dispatch_events is not None:
            self.registry.register(DispatchCollector(dispatch_events))

    def watch_local_jobs(self, local_jobs: Callable[[], LocalJobsView | None]) -> None:
        """Register the replica's local jobs per class, its unstarted bulk jobs (bulk claim
        pacing's count: `DispatcherConfig.max_unstarted_bulk_jobs`) and the work they still
        have to run (what bulk admission counts ahead of a new job); None before the
        dispatcher runs."""
        self.registry.register(LocalJobsCollector(local_jobs))

    def watch_intake(self, lane: IntakeLane) -> None:
        """Register the bulk intake lane's gauges (gateway/admission/intake_lane.py)."""
        self.registry.register(IntakeCollector(lane))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(
        self,
        engine_load: Callable[[], LoadSnapshot | None],
        queue_depths: Callable[[], dict[RequestClass, tuple[int, int]]],
    ):
        self._engine_load = engine_load
        self._queue_depths = queue_depths

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily("mixgate_queue_depth", "Queued requests", labels=["class"])
        tokens = GaugeMetricFamily(
            "mixgate_queued_tokens", "Queued work (prompt + max_tokens)", labels=["class"]
        )
        for request_class, (jobs, queued) in self._queue_depths().items():
            depth.add_metric([request_class.value], jobs)
            tokens.add_metric([request_class.value], queued)
        yield depth
        yield tokens
        load = self._engine_load()
        if load is None:
            return
        running = GaugeMetricFamily("mixgate_engine_running", "Running sequences", labels=["class"])
        waiting = GaugeMetricFamily(
            "mixgate_engine_waiting", "Engine-waiting sequences", labels=["class"]
        )
        for request_class in RequestClass:
            running.add_metric([request_class.value], load.running_by_class.get(request_class, 0))
            waiting.add_metric([request_class.value], load.waiting_by_class.get(request_class, 0))
        yield running
        yield waiting
        yield GaugeMetricFamily(
            "mixgate_kv_cache_usage", "Fraction of KV blocks in use", value=load.kv_usage
        )
        yield CounterMetricFamily(
            "mixgate_preemptions", "Sequences preempted by recompute", value=load.total_preemptions
        )
        yield CounterMetricFamily("mixgate_engine_steps", "Engine steps run", value=load.steps)
        if load.recent_step_s is not None:
            yield GaugeMetricFamily(
                "mixgate_step_seconds", "Median recent step time", value=load.recent_step_s
            )
        if load.step_cost is not None:
            yield GaugeMetricFamily(
                "mixgate_step_cost_fixed_seconds",
                "Recent steps fit as fixed + per token: the fixed part (bulk drain predictions)",
                value=load.step_cost.fixed_s,
            )
            yield GaugeMetricFamily(
                "mixgate_step_cost_token_seconds",
                "Recent steps fit as fixed + per token: the part per scheduled token",
                value=load.step_cost.token_s,
            )
        if load.bulk_prefill is not None:
            yield GaugeMetricFamily(
                "mixgate_bulk_prefill_tokens_per_step",
                "Bulk prompt tokens per step while bulk had prompts (bulk drain predictions)",
                value=load.bulk_prefill.tokens_per_step,
            )
            yield GaugeMetricFamily(
                "mixgate_bulk_prefill_step_seconds",
                "Mean time of the steps in which bulk had prompts to prefill",
                value=load.bulk_prefill.step_s,
            )
        if load.threads is not None:
            yield GaugeMetricFamily(
                "mixgate_engine_threads",
                "Threads the engine core's steps run on now (fewer while its cores are busy)",
                value=load.threads,
            )


# Step records pushed by engines that run in their own process (engine.process.client's step
# listener), kept per engine: the last _PUSHED_STEPS_KEPT, as a step history window would.
_PUSHED_STEPS_KEPT = 4096
_pushed_steps: weakref.WeakKeyDictionary[object, deque[StepRecord]] = weakref.WeakKeyDictionary()


def engine_step_records(engine: object) -> Sequence[StepRecord]:
    """An engine's recent step records: those its process pushes to its step listener (the
    engine core client; the listener is attached on the first call), or the in-thread engine's
    ``engine.history`` (the vLLM backend's ``engine.stats.history``); none where it keeps none.
    """
    if engine is None:
        return []
    add_listener = getattr(engine, "add_step_listener", None)
    if add_listener is not None:
        buffer = _pushed_steps.get(engine)
        if buffer is None:
            buffer = _pushed_steps[engine] = deque(maxlen=_PUSHED_STEPS_KEPT)
            kept = buffer  # the listener holds the buffer, not the engine: no cycle to keep
            add_listener(lambda message: kept.extend(getattr(message, "steps", ())))
        return list(buffer)
    inner = getattr(engine, "engine", None)
    history = getattr(inner, "history", None) or getattr(
        getattr(inner, "stats", None), "history", None
    )
    records = getattr(history, "records", None)
    # NOTE: list() of a deque is one C call under the GIL: safe while the engine appends.
    return list(records) if records is not None else []


class _StepCollector(Collector):
    """Cumulative step composition: tokens by (class, kind), and step seconds shared out by
    each step's token share, so a scrape delta says where the engine's time went per class.

    The engine keeps only a window of recent steps, so totals grow at scrape time from the
    steps not yet seen (by step index); steps that left the window between two scrapes are
    counted in ``mixgate_engine_steps_unseen_total`` instead of silently lost."""

    def __init__(self, step_records: Callable[[], Sequence[StepRecord]]):
        self._step_records = step_records
        self._last_index = -1
        self._tokens: dict[tuple[str, str], float] = {}
        self._seconds: dict[tuple[str, str], float] = {}
        self._steps = 0
        self._step_seconds = 0.0
        self._unseen = 0

    def _catch_up(self) -> None:
        new = [r for r in self._step_records() if r.step_index > self._last_index]
        if not new:
            return
        if self._last_index >= 0:
            self._unseen += max(0, new[0].step_index - self._last_index - 1)
        for record in new:
            total = record.num_tokens
            self._steps += 1
            self._step_seconds += record.duration_s
            for (request_class, kind), tokens in record.tokens_by_kind.items():
                key = (request_class.value, kind)
                self._tokens[key] = self._tokens.get(key, 0.0) + tokens
                share = tokens / total if total else 0.0
                self._seconds[key] = self._seconds.get(key, 0.0) + record.duration_s * share
        self._last_index = new[-1].step_index

    def collect(self) -> Iterable[Metric]:
        self._catch_up()
        tokens = CounterMetricFamily(
            "mixgate_engine_step_tokens",
            "Tokens engine steps carried, by class and kind (prefill | decode)",
            labels=["class", "kind"],
        )
        seconds = CounterMetricFamily(
            "mixgate_engine_step_class_seconds",
            "Engine step seconds shared out by each step's token share, by class and kind",
            labels=["class", "kind"],
        )
        for key in sorted(self._tokens):
            tokens.add_metric(list(key), self._tokens[key])
            seconds.add_metric(list(key), self._seconds[key])
        yield tokens
        yield seconds
        yield CounterMetricFamily(
            "mixgate_engine_observed_steps", "Engine steps seen in the record", value=self._steps
        )
        yield CounterMetricFamily(
            "mixgate_engine_observed_step_seconds",
            "Seconds of the engine steps seen in the record",
            value=self._step_seconds,
        )
        yield CounterMetricFamily(
            "mixgate_engine_steps_unseen",
            "Engine steps that left the record between two scrapes",
            value=self._unseen,
        )


class _RuntimeCollector(Collector):
    """The event loop's live tasks: flat between bursts of traffic, or something leaks."""

    def collect(self) -> Iterable[Metric]:
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # scraped from outside the event loop (tests render directly)
            return
        yield GaugeMetricFamily("mixgate_asyncio_tasks", "Live asyncio tasks", value=tasks)
