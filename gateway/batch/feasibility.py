"""Can a whole batch finish within its completion window, given the queues ahead of it?

Pure arithmetic on `policies.admission`'s model (no I/O, no clock): the work ahead drains at
the engine's rates (interactive first, `EngineRates.drain_s`; then the bulk queue and the
replica's bulk jobs in flight, `EngineRates.bulk_start_s`), then the batch's own prompt tokens
and its output bound (the sum of its lines' max_tokens) as bulk work (`EngineRates.bulk_work_s`:
the measured bulk prefill pace where there is one), since its lines run side by side. The
prediction, scaled by admission's safety factor, must fit in the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.admission import AdmissionConfig, EngineRates, QueueState
from policies.request_class import RequestClass

__all__ = ["BatchPrediction", "BatchWork", "predict_batch"]


@dataclass(frozen=True, slots=True)
class BatchWork:
    prompt_tokens: int
    # The sum of the lines' max_tokens: an upper bound on what the batch generates.
    output_tokens: int


@dataclass(frozen=True, slots=True)
class BatchPrediction:
    ahead_s: float
    own_s: float
    window_s: float
    safety_factor: float

    @property
    def finish_s(self) -> float:
        return self.ahead_s + self.own_s

    @property
    def fits(self) -> bool:
        return self.finish_s * self.safety_factor <= self.window_s

    def refusal_message(self) -> str:
        return (
            f"The batch cannot finish within its completion window: predicted "
            f"{self.finish_s:.1f} s (x{self.safety_factor:g} safety factor) with "
            f"{self.ahead_s:.1f} s of queued work ahead and {self.own_s:.1f} s of its own, "
            f"for a window of {self.window_s:.0f} s. Use a longer completion_window, "
            "split the batch, or retry later."
        )

    @property
    def retry_after_s(self) -> float:
        """When the queue ahead may have drained enough (at least 1 s)."""
        excess_s = self.finish_s - self.window_s / self.safety_factor
        return max(1.0, min(self.ahead_s, excess_s))


def predict_batch(
    work: BatchWork,
    window_s: float,
    queues: Mapping[RequestClass, QueueState],
    rates: EngineRates,
    config: AdmissionConfig,
) -> BatchPrediction:
    interactive, bulk = RequestClass.INTERACTIVE, RequestClass.BULK
    ahead_s = rates.drain_s(queues[interactive], interactive) + rates.bulk_start_s(queues[bulk])
    own_s = rates.bulk_work_s(work.prompt_tokens, work.output_tokens)
    return BatchPrediction(ahead_s, own_s, window_s, config.safety_factor)
