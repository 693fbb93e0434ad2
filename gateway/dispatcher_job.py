"""Running one claimed job on the local engine: deltas to its token stream, its result to Redis.

Order of writes at the end: `complete()` first, then the stream's last event. The fenced
complete decides whether this attempt's outcome counts; a replica that lost its lease must not
put an END or ERROR on a stream that the lease holder is still writing to.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import redis.asyncio as aioredis
import redis.exceptions
import structlog

from engine.async_engine import AsyncEngine
from engine.errors import EngineDeadError, RequestValidationError
from engine.request import GenerationRequest, RequestMetrics, RequestOutput
from gateway.dispatcher_events import DispatchCounters, DispatchEvent, DispatchEventKind
from gateway.dispatcher_notices import CANCELLED_EVENT
from gateway.dispatcher_retry import TRANSIENT_ERRORS, Backoff, retry_transient
from gateway.job_payload import JobPayload
from gateway.queue import ClaimedJob, JobStatus, QueueStore
from gateway.redis_text import redis_text
from gateway.token_stream import DELTA, END, ERROR, TokenStreams
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.dispatcher")


@dataclass(slots=True, eq=False)
class LocalJob:
    """A job this replica holds a lease on, from its claim until its task ends."""

    claimed: ClaimedJob
    # A cancel message or flag named it: abort, then complete as cancelled.
    cancel_requested: bool = False
    # renew said stale: another replica holds the job now; abort and write nothing more.
    fenced: bool = False
    # Drain: aborted here, and the dispatcher returns the lease to the queue; write nothing.
    handed_back: bool = False
    # Generation is over and complete() is under way: no longer abortable, and a stale renew
    # may just mean that our own complete() landed.
    finishing: bool = False

    @property
    def job_id(self) -> str:
        return self.claimed.job.job_id

    @property
    def token(self) -> int:
        return self.claimed.lease_token

    @property
    def request_class(self) -> RequestClass:
        return self.claimed.job.request_class

    @property
    def engine_request_id(self) -> str:
        # NOTE: the lease token makes every attempt a distinct engine request: after a lost
        # lease this replica may claim the same job again while the old attempt is still
        # being aborted, and the engine refuses duplicate ids.
        return f"{self.job_id}#{self.token}"

    @property
    def stopping(self) -> bool:
        return self.cancel_requested or self.fenced or self.handed_back

    @property
    def abortable(self) -> bool:
        return not self.finishing and not self.stopping


@dataclass(frozen=True, slots=True)
class _Outcome:
    text: str
    # The finishing delta, or None when the loop left early (cancel, lost lease, drain).
    final: RequestOutput | None


def timings_of(metrics: RequestMetrics | None) -> dict[str, Any]:
    """The END event's timings (engine clock; arrival is the job's admission time)."""
    if metrics is None:
        return {}
    return {
        "queue_s": metrics.queue_delay_s,
        "ttft_s": metrics.ttft_s,
        "e2e_s": metrics.e2e_s,
        "preemptions": metrics.num_preemptions,
        "cached_prompt_tokens": metrics.num_cached_prompt_tokens,
    }


class JobRunner:
    """Runs claimed jobs; shared by every job task of one dispatcher."""

    def __init__(
        self,
        *,
        store: QueueStore,
        streams: TokenStreams,
        engine: AsyncEngine,
        redis: aioredis.Redis,
        clock_ms: Callable[[], int],
        engine_clock_s: Callable[[], float],
        backoff: Backoff,
        counters: DispatchCounters,
    ) -> None:
        self._store = store
        self._streams = streams
        self._engine = engine
        self._redis = redis
        self._clock_ms = clock_ms
        self._engine_clock_s = engine_clock_s
        self._backoff = backoff
        self._counters = counters

    async def run(self, local: LocalJob) -> None:
        """Run the job to a written outcome, or to nothing at all when the lease is not ours."""
        if local.cancel_requested:
            await self._finish_cancelled(local)
            return
        try:
            request = self._request(local)
        except (KeyError, TypeError, ValueError) as error:
            await self._fail(
                local, 400, "invalid_request", f"the queued request is invalid: {error}"
            )
            return
        try:
            outcome = await self._generate(local, request)
        except RequestValidationError as error:
            await self._fail(local, 400, error.code, str(error))
            return
        except redis.exceptions.RedisError:
            # Not transient (those are retried): leave the lease to lapse, so reclaim retries
            # the job, rather than record an engine failure that did not happen.
            raise
        except EngineDeadError:
            # NOTE: the engine (process) died, the job did not fail: hand the lease back
            # (fenced, zero length) so reclaim requeues it and it completes exactly once after
            # a restart or on another replica; a chat that already streamed tokens gets its
            # error event from reclaim, by its rule.
            await self._hand_back(local)
            return
        except Exception as error:
            log.exception("engine_failed", job_id=local.job_id)
            await self._fail(local, 500, "engine_error", f"the engine failed: {error}")
            return
        await self._settle(local, outcome)

    async def _hand_back(self, local: LocalJob) -> None:
        local.handed_back = True
        renew = partial(self._store.renew, local.job_id, local.token, self._clock_ms(), 0)
        await retry_transient(renew, what="hand_back", backoff=self._backoff)
        self._emit(local, DispatchEventKind.HANDED_BACK)

    def _request(self, local: LocalJob) -> GenerationRequest:
        job = local.claimed.job
        # Engine-clock time of admission, so the queue wait in Redis counts in TTFT.
        waited_s = max(0, self._clock_ms() - job.enqueue_ms) / 1000.0
        payload = JobPayload.from_json(job.request_json)
        return payload.generation_request(
            local.engine_request_id, job.request_class, arrival_s=self._engine_clock_s() - waited_s
        )

    async def _generate(self, local: LocalJob, request: GenerationRequest) -> _Outcome:
        parts: list[str] = []
        final: RequestOutput | None = None
        mark_first = local.request_class is RequestClass.INTERACTIVE
        # generate() is an async generator; closing it early aborts the request in the engine
        # (which frees its KV blocks), so close it explicitly rather than wait for GC.
        deltas = cast(AsyncGenerator[RequestOutput, None], self._engine.generate(request))
        try:
            async for delta in deltas:
                if local.stopping:
                    break
                if delta.new_token_ids or delta.new_text:
                    parts.append(delta.new_text)
                    data = {"text": delta.new_text, "token_ids": list(delta.new_token_ids)}
                    await self._publish(local, DELTA, data)
                    if mark_first:
                        # After the publish, so the first token is not delayed by this write.
                        mark_first = False
                        mark = partial(self._store.mark_tokens_sent, local.job_id)
                        await retry_transient(mark, what="mark_tokens_sent", backoff=self._backoff)
                if delta.finished:
                    final = delta
        finally:
            await deltas.aclose()
        return _Outcome("".join(parts), final)

    async def _settle(self, local: LocalJob, outcome: _Outcome) -> None:
        if local.handed_back:
            return
        if local.fenced:
            log.warning("lease_lost_during_run", job_id=local.job_id, token=local.token)
            self._emit(local, DispatchEventKind.LEASE_LOST)
            return
        final = outcome.final
        if final is not None and final.finish_reason != "abort":
            # A cancel that arrived after the last token loses: the work is done.
            await self._finish_completed(local, outcome.text, final)
        elif local.cancel_requested:
            await self._finish_cancelled(local)
        else:
            await self._fail(local, 500, "aborted", "the engine aborted the request")

    async def _finish_completed(self, local: LocalJob, text: str, final: RequestOutput) -> None:
        usage = {
            "prompt_tokens": final.num_prompt_tokens,
            "completion_tokens": final.num_output_tokens,
            "total_tokens": final.num_prompt_tokens + final.num_output_tokens,
        }
        timings = timings_of(final.metrics)
        reason = final.finish_reason
        result = {"text": text, "finish_reason": reason, "usage": usage, "timings": timings}
        if not await self._complete(local, JobStatus.COMPLETED, json.dumps(result), None):
            return
        await self._publish(
            local, END, {"finish_reason": reason, "usage": usage, "timings": timings}
        )
        itls_s = final.metrics.itls_s if final.metrics is not None else []
        self._emit(local, DispatchEventKind.COMPLETED, {**timings, "itls_s": itls_s})

    async def _finish_cancelled(self, local: LocalJob) -> None:
        if await self._complete(local, JobStatus.CANCELLED, None, None):
            await self._publish(local, ERROR, CANCELLED_EVENT)
            self._emit(local, DispatchEventKind.CANCELLED)

    async def _fail(self, local: LocalJob, status: int, code: str, message: str) -> None:
        error = {"code": code, "message": message}
        if await self._complete(local, JobStatus.FAILED, None, json.dumps(error)):
            await self._publish(local, ERROR, {"status": status, **error})
            self._emit(local, DispatchEventKind.FAILED)

    async def _complete(
        self, local: LocalJob, status: JobStatus, result_json: str | None, error_json: str | None
    ) -> bool:
        """The fenced write of the job's outcome; False (logged) when the lease is not ours."""
        local.finishing = True
        in_doubt = False

        async def attempt() -> bool:
            nonlocal in_doubt
            try:
                return await self._store.complete(
                    local.job_id, local.token, status, result_json, error_json, self._clock_ms()
                )
            except TRANSIENT_ERRORS:
                in_doubt = True
                raise

        ok = await retry_transient(attempt, what="complete", backoff=self._backoff)
        if not ok and in_doubt:
            # NOTE: an attempt lost in transit may have been applied, and then its retry reads
            # 'stale'. The job hash tells: our status under our token means the write was ours.
            ok = await self._landed(local, status)
        if not ok:
            log.warning("complete_refused_stale_lease", job_id=local.job_id, token=local.token)
            self._emit(local, DispatchEventKind.LEASE_LOST)
        return ok

    async def _landed(self, local: LocalJob, status: JobStatus) -> bool:
        key = self._store.keys.job(local.job_id)
        read = partial(self._redis.hmget, key, ["status", "lease_token"])
        found, token = await retry_transient(read, what="read_back", backoff=self._backoff)
        return redis_text(found) == status.value and redis_text(token) == str(local.token)

    async def _publish(self, local: LocalJob, kind: str, data: dict[str, Any]) -> None:
        # NOTE: a publish lost in transit and retried can append one event twice; the stream
        # API has no idempotent append, and losing an event would be worse.
        publish = partial(self._streams.publish, local.job_id, kind, data)
        await retry_transient(publish, what=f"publish_{kind}", backoff=self._backoff)

    def _emit(
        self, local: LocalJob, kind: DispatchEventKind, timings: dict[str, Any] | None = None
    ) -> None:
        self._counters.record(DispatchEvent(kind, local.request_class, local.job_id, timings))
