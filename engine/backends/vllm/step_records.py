"""The class-aware scheduler's record of each vLLM step: tokens by class and kind, and its time.

vLLM's own per-step stats (`SchedulerIterationDetails`) count prefill and decode tokens for the
step as a whole; which class they belong to is known only where the step is composed, in vLLM's
engine-core process. `StepRecorder` turns vLLM's `SchedulerOutput` (tokens scheduled per request
id) and the requests themselves into the same `StepRecord` the native engine keeps, so
`/metrics`, `bench breakdown`'s step table and admission's rates read one shape from either
engine (`engine.backends.vllm.step_channel` carries them to the gateway).

Pure: no vLLM import, no clock (times are passed in). A request is read through the attributes
vLLM's `Request` has: `priority` (interactive 0, bulk 1), `num_computed_tokens` (already
advanced by this step's tokens when `schedule()` returns), `num_prompt_tokens`, `num_tokens`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from engine.core.step_record import StepRecord
from policies.request_class import RequestClass

__all__ = ["StepRecorder", "class_of_priority", "tokens_by_kind"]

# The vLLM priority of each class (lower runs first): engine.backends.vllm.backend's _PRIORITY.
_INTERACTIVE_PRIORITY = 0


def class_of_priority(priority: int) -> RequestClass:
    return RequestClass.INTERACTIVE if priority <= _INTERACTIVE_PRIORITY else RequestClass.BULK


def tokens_by_kind(
    scheduled_tokens: Mapping[str, int], requests: Mapping[str, Any]
) -> dict[tuple[RequestClass, str], int]:
    """The step's tokens by (class, "prefill" | "decode").

    A request's tokens up to the last one it already holds are prefill: its prompt, or the
    prompt and outputs it recomputes after a preemption; the token that samples the next one
    past that is a decode. So a prompt's last chunk is all prefill, and a plain decode is one.
    """
    counts: dict[tuple[RequestClass, str], int] = {}
    for request_id, tokens in scheduled_tokens.items():
        request = requests.get(request_id)
        if request is None or tokens <= 0:
            continue
        computed_before = request.num_computed_tokens - tokens
        known = max(request.num_prompt_tokens, request.num_tokens - 1)
        prefill = min(tokens, max(0, known - computed_before))
        request_class = class_of_priority(request.priority)
        for kind, count in (("prefill", prefill), ("decode", tokens - prefill)):
            if count:
                key = (request_class, kind)
                counts[key] = counts.get(key, 0) + count
    return counts


def _by_class(requests: Iterable[Any]) -> dict[RequestClass, int]:
    counts = dict.fromkeys(RequestClass, 0)
    for request in requests:
        counts[class_of_priority(request.priority)] += 1
    return counts


class StepRecorder:
    """Pairs each step's `schedule()` with its `update_from_output()` into a `StepRecord`.

    Times are the engine-core process's `time.monotonic()`: the host's monotonic clock, which
    the gateway's engine clock reads too (one host, any process).

    NOTE: a FIFO, not one slot: with a batch queue (pipeline parallelism, async scheduling)
    vLLM schedules the next step before the last one's output is in. Steps that scheduled no
    token (vLLM still calls both) are not recorded, as the native engine records none.
    """

    def __init__(self) -> None:
        # Each scheduled step's record, its index and duration filled in when its output is in.
        self._pending: deque[StepRecord | None] = deque()
        self._next_index = 0

    def scheduled(
        self,
        *,
        started_s: float,
        scheduled_tokens: Mapping[str, int],
        requests: Mapping[str, Any],
        running: Iterable[Any],
        waiting: Iterable[Any],
        kv_usage: float,
        num_preemptions: int,
    ) -> None:
        """What `schedule()` gave this step (`started_s`: when `schedule()` was entered)."""
        tokens = tokens_by_kind(scheduled_tokens, requests)
        if not tokens:
            self._pending.append(None)
            return
        self._pending.append(
            StepRecord(
                step_index=-1,
                started_s=started_s,
                duration_s=0.0,
                tokens_by_kind=tokens,
                running_by_class=_by_class(running),
                waiting_by_class=_by_class(waiting),
                kv_usage=kv_usage,
                num_preemptions=num_preemptions,
            )
        )

    def ended(self, now_s: float) -> StepRecord | None:
        """The oldest scheduled step's record, its model output now in; None for a step with no
        tokens (or an output with no step before it)."""
        if not self._pending:
            return None
        pending = self._pending.popleft()
        if pending is None:
            return None
        record = replace(
            pending, step_index=self._next_index, duration_s=max(0.0, now_s - pending.started_s)
        )
        self._next_index += 1
        return record
