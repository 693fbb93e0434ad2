"""vLLM's per-iteration stats turned into the engine's step history and load counters.

vLLM's engine core sends `SchedulerStats` (requests running and waiting, KV usage, the step's
prefill and decode token counts and its duration when iteration details are on) and
`IterationStats` (preemptions) with its outputs; the front end hands them to stat loggers.
`VllmStatsTracker` is fed by such a logger and keeps what `LoadSnapshot` needs. Under the mixgate
policy its step history is fed by the class-aware scheduler's own records instead
(`engine.backends.vllm.step_channel`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.core.step_record import StepHistory, StepRecord
from policies.request_class import RequestClass

__all__ = ["VllmStatsTracker", "stat_logger_factory"]


class VllmStatsTracker:
    def __init__(self, clock: Callable[[], float], *, records_steps: bool = True) -> None:
        """`records_steps` False: the step history is fed elsewhere (the class-aware scheduler's
        own records, `engine.backends.vllm.step_channel`); only the counts are kept here."""
        self._clock = clock
        self._records_steps = records_steps
        self.history = StepHistory()
        # vLLM's own counts, as of the last stats it sent.
        self.num_running = 0
        self.num_waiting = 0
        self.kv_usage = 0.0
        self.total_preemptions = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if iteration_stats is not None:
            self.total_preemptions += int(iteration_stats.num_preempted_reqs)
        if scheduler_stats is None:
            return
        self.num_running = int(scheduler_stats.num_running_reqs)
        self.num_waiting = int(scheduler_stats.num_waiting_reqs)
        self.kv_usage = float(scheduler_stats.kv_cache_usage)
        details = scheduler_stats.iteration_details
        if not self._records_steps or details is None or details.is_dummy:
            return
        duration_s = float(details.elapsed_ms) / 1000.0
        # NOTE: vLLM's counts are per step, not per class; they go under bulk (only under the
        # fcfs and priority policies: mixgate's scheduler sends its own per-class records).
        # Admission reads only the class-summed rates (StepHistory.rate_tokens_per_s).
        self.history.add(
            StepRecord(
                step_index=int(details.iteration_index),
                started_s=self._clock() - duration_s,
                duration_s=duration_s,
                tokens_by_kind={
                    (RequestClass.BULK, "prefill"): int(details.num_ctx_tokens),
                    (RequestClass.BULK, "decode"): int(details.num_generation_tokens),
                },
                running_by_class={RequestClass.BULK: self.num_running},
                waiting_by_class={RequestClass.BULK: self.num_waiting},
                kv_usage=self.kv_usage,
                num_preemptions=0,
            )
        )


def stat_logger_factory(tracker: VllmStatsTracker) -> Any:
    """A vLLM `StatLoggerFactory` whose loggers feed `tracker` (imports vLLM)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _TrackerLogger(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            tracker.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _TrackerLogger
