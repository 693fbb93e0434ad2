"""The timings a finished job reports in its END event (and its stored result): its queue
wait and the parts of it, TTFT, end-to-end, and the two instants a reader can match against the
engine's step records."""

from __future__ import annotations

from typing import Any

from engine.core.request import RequestMetrics

__all__ = ["timings_of"]


def timings_of(metrics: RequestMetrics | None) -> dict[str, Any]:
    """The END event's timings (engine clock; arrival is the job's admission time)."""
    if metrics is None:
        return {}
    return {
        "queue_s": metrics.queue_delay_s,
        # queue_s's first two parts (the rest is the wait in the engine's scheduler).
        "dispatch_s": metrics.dispatch_s,
        "accept_s": metrics.accept_s,
        "ttft_s": metrics.ttft_s,
        # The first token with text (None when the request had no detokenized output).
        "text_ttft_s": metrics.text_ttft_s,
        "e2e_s": metrics.e2e_s,
        # Two instants, not spans: on the clock of GET /v1/engine/steps' started_s (the host's
        # monotonic clock), so a reader can name the steps the request waited on.
        "handed_at_s": metrics.handed_s,
        "first_token_at_s": metrics.first_token_s,
        "preemptions": metrics.num_preemptions,
        "cached_prompt_tokens": metrics.num_cached_prompt_tokens,
    }
