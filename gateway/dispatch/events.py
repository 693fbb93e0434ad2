"""What a dispatcher reports about the jobs it handles: events, per-class counters, a hook."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import structlog

from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.dispatcher")


class DispatchEventKind(StrEnum):
    # This replica leased the job and started it.
    CLAIMED = "claimed"
    # Terminal statuses this replica wrote (completed / failed / cancelled by the lease holder,
    # failed / cancelled by this replica's reclaim sweep, expired by its claim).
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    # The lease turned out to be someone else's (renew or complete said stale): this replica
    # aborted its attempt and wrote nothing.
    LEASE_LOST = "lease_lost"
    # Drain: the job was aborted here and its lease returned to the queue.
    HANDED_BACK = "handed_back"
    # This replica's reclaim sweep put a lapsed lease back in its queue.
    REQUEUED = "requeued"


@dataclass(frozen=True, slots=True)
class DispatchEvent:
    kind: DispatchEventKind
    request_class: RequestClass
    job_id: str
    # On COMPLETED: queue_s, ttft_s, e2e_s, preemptions, cached_prompt_tokens (as in the END
    # event) plus itls_s, the inter-token gaps, for latency histograms.
    timings: Mapping[str, object] | None = None


DispatchHook = Callable[[DispatchEvent], None]
# (class, terminal status, timings or None): the shape the metrics module counts and observes.
FinishedHook = Callable[[RequestClass, str, dict[str, object] | None], None]

# The kinds that are a job's terminal status, named as JobStatus names them.
TERMINAL_KINDS = frozenset(
    {
        DispatchEventKind.COMPLETED,
        DispatchEventKind.FAILED,
        DispatchEventKind.CANCELLED,
        DispatchEventKind.EXPIRED,
    }
)


def combine_hooks(
    on_event: DispatchHook | None, on_finished: FinishedHook | None
) -> DispatchHook | None:
    """One hook that feeds both: every event to `on_event`, terminal ones to `on_finished`."""
    if on_finished is None:
        return on_event

    def hook(event: DispatchEvent) -> None:
        if on_event is not None:
            on_event(event)
        if event.kind in TERMINAL_KINDS:
            timings = dict(event.timings) if event.timings is not None else None
            on_finished(event.request_class, event.kind.value, timings)

    return hook


class DispatchCounters:
    """Totals per (event kind, class) since start; read by the metrics module at scrape time."""

    def __init__(self, hook: DispatchHook | None = None) -> None:
        self._counts: Counter[tuple[DispatchEventKind, RequestClass]] = Counter()
        self._hook = hook

    def record(self, event: DispatchEvent) -> None:
        self._counts[(event.kind, event.request_class)] += 1
        if self._hook is None:
            return
        try:
            self._hook(event)
        except Exception:  # an observer's bug must not stop a job from being dispatched
            log.exception("dispatch_hook_failed", kind=event.kind.value, job_id=event.job_id)

    def count(self, kind: DispatchEventKind, request_class: RequestClass | None = None) -> int:
        """One class's total, or every class's when `request_class` is None."""
        if request_class is not None:
            return self._counts[(kind, request_class)]
        return sum(n for (k, _), n in self._counts.items() if k is kind)

    def snapshot(self) -> dict[tuple[DispatchEventKind, RequestClass], int]:
        return dict(self._counts)
