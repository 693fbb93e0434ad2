"""Prometheus metrics, with a `class` label wherever the traffic class applies.

Request-path counters and latency histograms are updated as things happen; engine and queue
gauges are read at scrape time from the engine's load snapshot and the last queue depths, so a
scrape never waits on Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.step_record import LoadSnapshot
from policies.request_class import RequestClass

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


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

        self.registry.register(_RuntimeCollector())

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
    ) -> None:
        """Register the scrape-time collector over the engine and the queues."""
        self.registry.register(_StateCollector(engine_load, queue_depths))

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


class _RuntimeCollector(Collector):
    """The event loop's live tasks: flat between bursts of traffic, or something leaks."""

    def collect(self) -> Iterable[Metric]:
        try:
            tasks = len(asyncio.all_tasks())
        except RuntimeError:  # scraped from outside the event loop (tests render directly)
            return
        yield GaugeMetricFamily("mixgate_asyncio_tasks", "Live asyncio tasks", value=tasks)
