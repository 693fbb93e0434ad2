"""Telling readers about jobs that a Lua script finished, not a running attempt.

Claim marks jobs expired whose deadline passed while they waited; reclaim fails or cancels
jobs whose lease lapsed. No job task exists for them, yet an SSE client may be waiting on
their stream: each gets one ERROR event, from the replica whose call finished it (the scripts
are atomic, so exactly one replica learns of each id).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

import redis.asyncio as aioredis

from gateway.dispatch.events import DispatchCounters, DispatchEvent, DispatchEventKind
from gateway.dispatch.retry import Backoff, retry_transient
from gateway.dispatch.stream_event import ERROR
from gateway.dispatch.token_stream import TokenStreams
from gateway.queue import QueueStore, ReclaimResult
from gateway.queue.redis_text import redis_text
from policies.request_class import RequestClass

# The last event of a stream whose job was cancelled.
CANCELLED_EVENT: dict[str, Any] = {
    "status": 499,
    "code": "cancelled",
    "message": "the request was cancelled",
}

_EXPIRED_EVENT: dict[str, Any] = {
    "status": 429,
    "code": "deadline_expired",
    "message": "the deadline passed before the request could start",
}


class ScriptOutcomes:
    def __init__(
        self,
        store: QueueStore,
        redis: aioredis.Redis,
        streams: TokenStreams,
        counters: DispatchCounters,
        backoff: Backoff,
    ) -> None:
        self._store = store
        self._redis = redis
        self._keys = store.keys
        self._streams = streams
        self._counters = counters
        self._backoff = backoff

    async def expired(self, job_ids: Sequence[str]) -> None:
        """Jobs that claim dropped because their deadline had passed."""
        fields = await self._fields(job_ids, "class")
        for job_id, (cls,) in zip(job_ids, fields, strict=True):
            await self.publish_error(job_id, _EXPIRED_EVENT)
            self._record(DispatchEventKind.EXPIRED, cls, job_id)

    async def reclaim(self, now_ms: int, batch: int) -> ReclaimResult:
        """Sweep every lapsed lease (`batch` per script call), then tell their readers."""
        requeued: list[str] = []
        failed: list[str] = []
        cancelled: list[str] = []
        while True:
            result = await self._store.reclaim(now_ms, batch)
            # Told batch by batch: a later call that fails must not silence these.
            await self.reclaimed(result)
            requeued += result.requeued_ids
            failed += result.failed_ids
            cancelled += result.cancelled_ids
            swept = len(result.requeued_ids) + len(result.failed_ids) + len(result.cancelled_ids)
            if swept < batch:
                return ReclaimResult(tuple(requeued), tuple(failed), tuple(cancelled))

    async def reclaimed(self, result: ReclaimResult) -> None:
        """Jobs that a reclaim sweep of this replica requeued, failed or cancelled."""
        ids = [*result.requeued_ids, *result.failed_ids, *result.cancelled_ids]
        by_id = dict(zip(ids, await self._fields(ids, "class", "error"), strict=True))
        for job_id in result.requeued_ids:
            self._record(DispatchEventKind.REQUEUED, by_id[job_id][0], job_id)
        for job_id in result.failed_ids:
            cls, error_json = by_id[job_id]
            # The replica that ran it is gone (or kept losing it): the reader must hear that
            # the stream ended, with the reason reclaim wrote.
            await self.publish_error(job_id, {"status": 503, **_error_fields(error_json)})
            self._record(DispatchEventKind.FAILED, cls, job_id)
        for job_id in result.cancelled_ids:
            await self.publish_error(job_id, CANCELLED_EVENT)
            self._record(DispatchEventKind.CANCELLED, by_id[job_id][0], job_id)

    async def publish_error(self, job_id: str, data: dict[str, Any]) -> None:
        publish = partial(self._streams.publish, job_id, ERROR, data)
        await retry_transient(publish, what="publish_error", backoff=self._backoff)

    async def _fields(self, job_ids: Sequence[str], *names: str) -> list[list[str]]:
        if not job_ids:
            return []

        async def read() -> list[Any]:
            async with self._redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hmget(self._keys.job(job_id), list(names))
                return await pipe.execute()

        replies = await retry_transient(read, what="read_job_fields", backoff=self._backoff)
        return [[redis_text(v) for v in reply] for reply in replies]

    def _record(self, kind: DispatchEventKind, cls: str, job_id: str) -> None:
        self._counters.record(DispatchEvent(kind, _class_or_bulk(cls), job_id))


def _class_or_bulk(value: str) -> RequestClass:
    # A hash that retention already removed has no class left: count it, do not crash.
    try:
        return RequestClass(value)
    except ValueError:
        return RequestClass.BULK


def _error_fields(error_json: str) -> dict[str, Any]:
    try:
        error = json.loads(error_json) if error_json else {}
    except ValueError:
        error = {}
    if not isinstance(error, dict):
        error = {}
    return {
        "code": error.get("code", "replica_lost"),
        "message": error.get("message", "the replica running this request stopped"),
    }
