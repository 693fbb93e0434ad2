"""The scrape-time gauges of the dispatcher and of bulk intake: event totals per class, the
jobs a replica holds and the work they still have to run, and the intake lane's slots
(`gateway/http/metrics.py` registers them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.admission.intake_lane import IntakeLane
from policies.in_flight_work import NO_WORK_IN_FLIGHT, InFlightWork
from policies.request_class import RequestClass

__all__ = ["DispatchCollector", "IntakeCollector", "LocalJobsCollector", "LocalJobsView"]


class DispatchCollector(Collector):
    """The dispatcher's totals per event and class (claimed, completed, lease_lost, requeued,
    ...): a soak's "no lease lost" and an operator's requeue rate are read from here."""

    def __init__(self, dispatch_events: Callable[[], Mapping[tuple[str, RequestClass], int]]):
        self._dispatch_events = dispatch_events

    def collect(self) -> Iterable[Metric]:
        events = CounterMetricFamily(
            "mixgate_dispatch_events",
            "Dispatcher events on this replica since start",
            labels=["event", "class"],
        )
        for (kind, request_class), count in sorted(self._dispatch_events().items()):
            events.add_metric([str(kind), request_class.value], count)
        yield events


# Local jobs per class, unstarted bulk jobs, and the work they still have to run per class.
LocalJobsView = tuple[Mapping[RequestClass, int], int, Mapping[RequestClass, InFlightWork]]


class LocalJobsCollector(Collector):
    """What this replica holds: its jobs per class, and of bulk those without a token yet (at
    the pacing limit, bulk waits in Redis for a first token here or for another replica)."""

    def __init__(self, local_jobs: Callable[[], LocalJobsView | None]):
        self._local_jobs = local_jobs

    def collect(self) -> Iterable[Metric]:
        snapshot = self._local_jobs()
        if snapshot is None:
            return
        by_class, unstarted_bulk, work = snapshot
        local = GaugeMetricFamily(
            "mixgate_dispatch_local_jobs",
            "Jobs this replica runs (claimed or started here, until their result is written)",
            labels=["class"],
        )
        for request_class in RequestClass:
            local.add_metric([request_class.value], by_class.get(request_class, 0))
        yield local
        yield GaugeMetricFamily(
            "mixgate_dispatch_unstarted_bulk_jobs",
            "Local bulk jobs the engine has given no token yet (bulk claim pacing's count)",
            value=unstarted_bulk,
        )
        tokens = GaugeMetricFamily(
            "mixgate_dispatch_work_in_flight_tokens",
            "Tokens this replica's jobs have still to run: prompts of jobs with no token yet, "
            "outputs up to max_tokens (bulk admission counts them ahead of a new job)",
            labels=["class", "kind"],
        )
        for request_class in RequestClass:
            held = work.get(request_class, NO_WORK_IN_FLIGHT)
            tokens.add_metric([request_class.value, "prompt"], held.prompt_tokens)
            tokens.add_metric([request_class.value, "output"], held.output_tokens)
        yield tokens


class IntakeCollector(Collector):
    """Bulk intake's slots, and the chats that hold it to its lower limit."""

    def __init__(self, lane: IntakeLane) -> None:
        self._lane = lane

    def collect(self) -> Iterable[Metric]:
        lane = self._lane
        yield GaugeMetricFamily(
            "mixgate_job_intake_in_flight", "Job submissions in intake", value=lane.in_flight
        )
        yield GaugeMetricFamily(
            "mixgate_job_intake_parked", "Job submissions waiting for a slot", value=lane.parked
        )
        yield GaugeMetricFamily(
            "mixgate_job_intake_limit",
            "Job submissions allowed at once now",
            value=lane.current_limit(),
        )
        yield GaugeMetricFamily(
            "mixgate_chats_awaiting_first_token",
            "Chats between their admission and their first text (bulk intake yields to them)",
            value=lane.chats_waiting,
        )
