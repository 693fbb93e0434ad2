"""Token delivery over a Redis Stream per request (`out:{id}`): the replica that runs a request
appends events; the HTTP handler on any replica reads them with XREAD BLOCK.

Redis carries a request's events only when its handler is not on the replica that runs it
(`gateway.dispatch.local_delivery` delivers them in-process otherwise, and bulk jobs that nobody
reads publish none). What goes to Redis leaves in one pipeline per event-loop tick for the whole
replica (`BatchedPublisher`): the deltas of one engine step, all streams together.

Events are stream entries with two fields: `e` (the kind) and `d` (JSON), as
`gateway.dispatch.stream_event` describes them; their ids are Redis's own, or `0-n` for the
events of an in-process stream that an attempt handed over to Redis (a resumable stream whose
client left), which keep the ids they were sent with.

A job's last event is written by the fenced `QueueStore.complete` itself (same script), so it
exists exactly when that attempt's outcome counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.dispatch.local_delivery import LocalDelivery
from gateway.dispatch.retry import Backoff, retry_transient
from gateway.dispatch.stream_event import END, ERROR, StreamEvent, event_json
from gateway.queue.redis_text import redis_text

__all__ = ["BatchedPublisher", "StreamTail", "TokenStreams", "event_json"]

# One pending append: stream key, entry fields, its id ("*": Redis picks), whether it is the
# last event, its waiter.
_Append = tuple[str, dict[str, str], str, bool, "asyncio.Future[None]"]


@dataclass(frozen=True, slots=True)
class StreamTail:
    """What a resume needs to know of a stream before it reads: is it kept, where it ends."""

    exists: bool
    # The newest entry, or None (no entry yet: its attempt has not handed over).
    last: StreamEvent | None


class TokenStreams:
    def __init__(
        self,
        redis: aioredis.Redis,
        key_for: Callable[[str], str],
        ttl_s: int = 3600,
        *,
        backoff: Backoff | None = None,
    ):
        # key_for(request_id) -> the stream key (gateway.queue.keys.Keys.out).
        self._redis = redis
        self._key_for = key_for
        self.ttl_s = ttl_s
        # This replica's in-process listeners (one registry per replica, shared by the HTTP
        # handlers and the dispatcher through this object).
        self.local = LocalDelivery(self)
        self.batched = BatchedPublisher(redis, key_for, ttl_s, backoff or Backoff())

    async def publish(self, request_id: str, kind: str, data: dict[str, Any]) -> str:
        """Append one event; the last event of a request also sets the stream's expiry."""
        key = self._key_for(request_id)
        fields = {"e": kind, "d": event_json(data)}
        if kind in (END, ERROR):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xadd(key, fields)  # type: ignore[arg-type]
                pipe.expire(key, self.ttl_s)
                entry_id, _ = await pipe.execute()
        else:
            entry_id = await self._redis.xadd(key, fields)  # type: ignore[arg-type]
        return redis_text(entry_id)

    async def read_once(self, request_id: str, after: str, block_ms: int) -> list[StreamEvent]:
        """The events after `after`, waiting up to block_ms for the first (may be none)."""
        key = self._key_for(request_id)
        reply: Any = await self._redis.xread({key: after}, block=block_ms, count=256)
        # RESP2 answers [[key, entries]]; RESP3 answers {key: entries}.
        streams = reply.items() if isinstance(reply, dict) else (reply or [])
        return [
            _event(redis_text(entry_id), fields)
            for _, entries in streams
            for entry_id, fields in entries
        ]

    async def tail(self, request_id: str) -> StreamTail:
        """Whether the stream exists and its newest entry, in one round trip."""
        key = self._key_for(request_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.exists(key)
            pipe.xrevrange(key, count=1)
            exists, newest = await pipe.execute()
        last = _event(redis_text(newest[0][0]), newest[0][1]) if newest else None
        return StreamTail(exists=bool(exists), last=last)

    async def read(
        self, request_id: str, after: str = "0-0", block_ms: int = 1000
    ) -> AsyncIterator[StreamEvent]:
        """Yield events after `after` until the last one; each wait is at most block_ms.

        Yields nothing for an empty wait only through the caller's own timeout: the loop
        keeps blocking, so callers wrap it in their deadline (and disconnect handling).
        """
        cursor = after
        while True:
            for event in await self.read_once(request_id, cursor, block_ms):
                cursor = event.entry_id
                yield event
                if event.is_last:
                    return


class BatchedPublisher:
    """Stream appends of one event-loop tick, from every job of this replica, in one pipeline.

    The engine hands a step's outputs to the loop in one callback, so the job tasks woken by
    it append in the same tick; the flush is a task created on the first append, which runs
    after them. While a flush is in flight, new appends wait for the next one (one flush at a
    time keeps every stream in order).
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        key_for: Callable[[str], str],
        ttl_s: int,
        backoff: Backoff,
    ) -> None:
        self._redis = redis
        self._key_for = key_for
        self._ttl_s = ttl_s
        self._backoff = backoff
        self._pending: list[_Append] = []
        self._flusher: asyncio.Task[None] | None = None
        # Pipelines sent so far (tests and the benchmark read it).
        self.flushes = 0

    async def publish(
        self, request_id: str, kind: str, data: dict[str, Any], entry_id: str = "*"
    ) -> None:
        """Append one event; returns once the pipeline that carried it was applied.

        NOTE: a pipeline lost in transit and retried can append its events twice; the stream
        API has no idempotent append, and losing events would be worse. (An explicit
        `entry_id` is not appended twice: the retry's XADD fails on the id, and the caller
        hears that error.)
        """
        # Shielded: a caller cancelled meanwhile does not take the others' flush down with it.
        await asyncio.shield(self.enqueue(request_id, kind, data, entry_id))

    def enqueue(
        self, request_id: str, kind: str, data: dict[str, Any], entry_id: str = "*"
    ) -> asyncio.Future[None]:
        """Queue one append now (appends keep the order of these calls); the future is done
        once the pipeline that carried it was applied."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fields = {"e": kind, "d": event_json(data)}
        last = kind in (END, ERROR)
        self._pending.append((self._key_for(request_id), fields, entry_id, last, done))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush_all(), name="stream-flush")
        return done

    async def _flush_all(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    refused = await retry_transient(
                        partial(self._send, batch), what="publish_batch", backoff=self._backoff
                    )
                except Exception as failure:  # noqa: BLE001 - every waiter hears it
                    refused = [failure] * len(batch)
                for (*_, done), why in zip(batch, refused, strict=True):
                    if done.done():
                        continue
                    if why is None:
                        done.set_result(None)
                    else:
                        done.set_exception(why)
        finally:
            self._flusher = None

    async def _send(self, batch: list[_Append]) -> list[BaseException | None]:
        """Each append's error, or None. NOTE: per append, so that one stream's refused
        explicit id (its top is already past it) fails only that stream's writer."""
        self.flushes += 1
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, fields, entry_id, last, _ in batch:
                pipe.xadd(key, fields, id=entry_id)  # type: ignore[arg-type]
                if last:
                    pipe.expire(key, self._ttl_s)
            replies = await pipe.execute(raise_on_error=False)
        refused: list[BaseException | None] = []
        at = 0
        for *_, last, _ in batch:
            reply = replies[at]
            refused.append(reply if isinstance(reply, BaseException) else None)
            at += 2 if last else 1
        return refused


def _event(entry_id: str, fields: dict[Any, Any]) -> StreamEvent:
    decoded = {redis_text(k): redis_text(v) for k, v in fields.items()}
    return StreamEvent(decoded["e"], orjson.loads(decoded["d"]), entry_id)
