"""Running one claimed job on the local engine: deltas to whoever reads them, its result to Redis.

Where the events of an attempt go is decided when it emits its first one
(`gateway.dispatch.local_delivery`): to a handler on this replica in-process, to the job's Redis
stream (batched per event-loop tick with every other job's), or nowhere (a bulk job nobody reads).

The last event (END or ERROR) comes after `complete()`: the fenced complete decides whether
this attempt's outcome counts, and a replica that lost its lease must not end a stream that
the lease holder is still writing to. On the Redis route the complete script appends the last
event itself (one round trip, atomic with the outcome); on the local route it is delivered
once complete() said ok.

A resumable stream whose client left (`Listener.abandon`) moves from the local route to the
Redis one at the attempt's next event, or at its complete: the events delivered so far are
appended under the ids they were sent with (`0-n`), and the later ones go on numbering, so a
resume on any replica reads on from the client's `Last-Event-ID`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
import redis.exceptions
import structlog

from engine.core.errors import EngineDeadError, RequestValidationError
from engine.core.request import GenerationRequest, RequestOutput
from engine.process.async_engine import AsyncEngine
from gateway.dispatch.events import DispatchCounters, DispatchEvent, DispatchEventKind
from gateway.dispatch.local_delivery import Route, is_watched
from gateway.dispatch.local_job import LocalJob
from gateway.dispatch.notices import CANCELLED_EVENT
from gateway.dispatch.retry import TRANSIENT_ERRORS, Backoff, retry_transient
from gateway.dispatch.stream_event import DELTA, END, ERROR, event_json, local_event_id
from gateway.dispatch.timings import timings_of
from gateway.dispatch.token_stream import TokenStreams
from gateway.dispatch.work_in_flight import WorkInFlight
from gateway.queue import JobStatus, QueueStore
from gateway.queue.payload import JobPayload
from gateway.queue.redis_text import redis_text
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.dispatcher")

__all__ = ["JobRunner"]


@dataclass(frozen=True, slots=True)
class _Outcome:
    text: str
    # The finishing delta, or None when the loop left early (cancel, lost lease, drain).
    final: RequestOutput | None


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
        on_first_token: Callable[[LocalJob], None] | None = None,
        work: WorkInFlight,
    ) -> None:
        """`on_first_token` hears each job's first token, on the event loop; `work` is told
        each job's split once parsed and the tokens it makes (keyed by lease token)."""
        self._store = store
        self._streams = streams
        self._engine = engine
        self._redis = redis
        self._clock_ms = clock_ms
        self._engine_clock_s = engine_clock_s
        self._backoff = backoff
        self._counters = counters
        self._on_first_token = on_first_token
        self._work = work

    async def run(self, local: LocalJob) -> None:
        """Run the job to a written outcome, or to nothing at all when the lease is not ours."""
        try:
            await self._run(local)
        finally:
            if local.listener is not None:
                # Without a last event delivered (lease lost, drain) it reads the stream again.
                local.listener.detach(local.token)

    async def _run(self, local: LocalJob) -> None:
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
        if local.started_here:
            # NOTE: decided now (after the payload is parsed, which the route reads), still in
            # the task's first step, not at the first event: the handler that admitted the
            # job registered its listener with no await since the start, and its stream
            # reader (created later) must find the attempt attached, or it would issue one
            # XREAD that can only time out.
            self._route(local)
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
        payload = local.payload = JobPayload.from_json(job.request_json)
        self._work.update(local.token, len(payload.prompt_token_ids), payload.sampling.max_tokens)
        now_s = self._engine_clock_s()
        # Handed now: _run passes it to the engine with no await in between.
        return payload.generation_request(
            local.engine_request_id, job.request_class, arrival_s=now_s - waited_s, handed_s=now_s
        )

    async def _generate(self, local: LocalJob, request: GenerationRequest) -> _Outcome:
        parts: list[str] = []
        final: RequestOutput | None = None
        mark_first = local.request_class is RequestClass.INTERACTIVE
        marking: asyncio.Task[bool] | None = None
        # generate() is an async generator; closing it early aborts the request in the engine
        # (which frees its KV blocks), so close it explicitly rather than wait for GC.
        deltas = cast(AsyncGenerator[RequestOutput, None], self._engine.generate(request))
        try:
            async for delta in deltas:
                if local.stopping:
                    break
                if delta.new_token_ids:
                    self._work.made_tokens(local.token, len(delta.new_token_ids))
                    if not local.made_tokens:
                        local.made_tokens = True
                        if self._on_first_token is not None:
                            self._on_first_token(local)
                if delta.new_token_ids or delta.new_text:
                    parts.append(delta.new_text)
                    data = {"text": delta.new_text, "token_ids": list(delta.new_token_ids)}
                    route = await self._current_route(local)
                    if mark_first and route is Route.REDIS:
                        # A reader elsewhere (another replica, a resumed stream) sees this
                        # token as soon as it is in Redis: mark first. Marked after, a replica
                        # killed in between left the job retryable although its reader had a
                        # token (reclaim requeued it: a retry repeats the tokens, or with no
                        # replica of its class left the stream never ends; seen in CI).
                        mark_first = False
                        mark = partial(self._store.mark_tokens_sent, local.job_id)
                        await retry_transient(mark, what="mark_tokens_sent", backoff=self._backoff)
                    await self._deliver(local, route, DELTA, data)
                    if mark_first and route is not Route.NOBODY:
                        # In-process delivery: the reader dies with this replica, so the mark
                        # can follow the token. After it, so the first token is not delayed by
                        # this write; beside the next deltas, not before them, so neither is
                        # the second (its round trip was in the second token's latency).
                        # Awaited below, before any outcome is written.
                        mark_first = False
                        mark = partial(self._store.mark_tokens_sent, local.job_id)
                        marking = asyncio.create_task(
                            retry_transient(mark, what="mark_tokens_sent", backoff=self._backoff)
                        )
                if delta.finished:
                    final = delta
        finally:
            await deltas.aclose()
            if marking is not None:
                await marking  # a failure raises here, as it did inside the loop
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
        end = {"finish_reason": reason, "usage": usage, "timings": timings}
        if not await self._complete(
            local, JobStatus.COMPLETED, orjson.dumps(result).decode(), None, END, end
        ):
            return
        itls_s = final.metrics.itls_s if final.metrics is not None else []
        self._emit(local, DispatchEventKind.COMPLETED, {**timings, "itls_s": itls_s})

    async def _finish_cancelled(self, local: LocalJob) -> None:
        if await self._complete(local, JobStatus.CANCELLED, None, None, ERROR, CANCELLED_EVENT):
            self._emit(local, DispatchEventKind.CANCELLED)

    async def _fail(self, local: LocalJob, status: int, code: str, message: str) -> None:
        error = {"code": code, "message": message}
        last = {"status": status, **error}
        if await self._complete(
            local, JobStatus.FAILED, None, orjson.dumps(error).decode(), ERROR, last
        ):
            self._emit(local, DispatchEventKind.FAILED)

    async def _complete(
        self,
        local: LocalJob,
        status: JobStatus,
        result_json: str | None,
        error_json: str | None,
        last_kind: str,
        last_data: dict[str, Any],
    ) -> bool:
        """The fenced write of the job's outcome, then its last event; False (logged) when the
        lease is not ours (then nothing is written or delivered)."""
        local.finishing = True
        in_doubt = False
        route = await self._current_route(local)
        on_stream = (last_kind, event_json(last_data)) if route is Route.REDIS else None

        async def attempt() -> bool:
            nonlocal in_doubt
            try:
                return await self._store.complete(
                    local.job_id,
                    local.token,
                    status,
                    result_json,
                    error_json,
                    self._clock_ms(),
                    last_event=on_stream,
                    stream_ttl_s=self._streams.ttl_s,
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
        elif local.listener is not None and local.listener.abandoned:
            # Its resumable client left while complete() was in flight: the stream goes to
            # Redis after all, its last event included, for a resume.
            await self._hand_over_last(local, last_kind, last_data)
        elif local.listener is not None:
            # NOTE: an in-doubt complete that landed wrote the stream's last event too (same
            # script), so nothing is appended again here.
            local.listener.deliver_new(last_kind, last_data)
        return ok

    async def _landed(self, local: LocalJob, status: JobStatus) -> bool:
        key = self._store.keys.job(local.job_id)
        read = partial(self._redis.hmget, key, ["status", "lease_token"])
        found, token = await retry_transient(read, what="read_back", backoff=self._backoff)
        return redis_text(found) == status.value and redis_text(token) == str(local.token)

    def _route(self, local: LocalJob) -> Route:
        """This attempt's route, decided once, at its first event (the latest moment, so that
        a handler on this replica has had every chance to register)."""
        if local.route is None:
            local.route, local.listener = self._streams.local.route(
                local.job_id, local.token, _watched(local)
            )
        return local.route

    async def _current_route(self, local: LocalJob) -> Route:
        """The attempt's route now: LOCAL turns REDIS once its resumable client has left."""
        route = self._route(local)
        if route is Route.LOCAL and local.listener is not None and local.listener.abandoned:
            await self._hand_over(local)
            return Route.REDIS
        return route

    async def _hand_over(self, local: LocalJob) -> None:
        """Move a local stream to Redis: what was delivered in-process, under its ids."""
        listener = local.listener
        assert listener is not None
        history, local.next_event_index = listener.handover()
        local.route, local.listener = Route.REDIS, None
        listener.detach(local.token)
        # Queued in order now, before any later event of this attempt; one pipeline.
        batched = self._streams.batched
        sent = [batched.enqueue(local.job_id, e.kind, e.data, e.entry_id) for e in history]
        log.info("stream_handed_over", job_id=local.job_id, events=len(history))
        await asyncio.gather(*(asyncio.shield(done) for done in sent))

    async def _hand_over_last(self, local: LocalJob, kind: str, data: dict[str, Any]) -> None:
        try:
            await self._hand_over(local)
            await self._publish(local, kind, data)
        except Exception:  # noqa: BLE001 - the outcome is written; only a resume misses it
            log.warning("stream_hand_over_failed", job_id=local.job_id, exc_info=True)

    async def _publish(self, local: LocalJob, kind: str, data: dict[str, Any]) -> Route:
        route = await self._current_route(local)
        await self._deliver(local, route, kind, data)
        return route

    async def _deliver(
        self, local: LocalJob, route: Route, kind: str, data: dict[str, Any]
    ) -> None:
        """One event to the attempt's reader by `route` (`_current_route`'s answer)."""
        if route is Route.LOCAL:
            assert local.listener is not None
            local.listener.deliver_new(kind, data)
        elif route is Route.REDIS:
            entry_id = "*"
            if local.next_event_index is not None:
                entry_id = local_event_id(local.next_event_index)
                local.next_event_index += 1
            # Batched with every other job's events of this tick; retried inside.
            await self._streams.batched.publish(local.job_id, kind, data, entry_id)

    def _emit(
        self, local: LocalJob, kind: DispatchEventKind, timings: dict[str, Any] | None = None
    ) -> None:
        self._counters.record(DispatchEvent(kind, local.request_class, local.job_id, timings))


def _watched(local: LocalJob) -> bool:
    """Whether a handler somewhere reads this job's events (chats mark their payload)."""
    try:
        payload = local.payload or JobPayload.from_json(local.claimed.job.request_json)
    except (KeyError, TypeError, ValueError):
        return True  # unreadable: run() fails it, and the reader (if any) must hear why
    return is_watched(payload.extra, payload.stream)
