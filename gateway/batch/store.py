"""`BatchStore`: a batch's Redis state, one method per step the API or the supervisor takes.

State changes that must be atomic are Lua scripts (`batch_record.lua`: a line's outcome exactly
once; `batch_transition.lua`: a status change, fenced by the supervisor's lock). Feeding a line
runs the queue's own admit (`QueueStore.admit_many`) with the batch's job listing as the
listing key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from gateway.batch.keys import BatchKeys
from gateway.batch.records import BatchRecord
from gateway.batch.scripts import load_scripts
from gateway.queue import AdmitStatus, NewJob, QueueStore
from gateway.queue.redis_text import redis_text

__all__ = ["BatchStore", "PassAborted"]

# How many list entries one command moves (RPUSH at creation, cleanup deletes).
_CHUNK = 1000


class PassAborted(Exception):
    """A fenced or compare-and-set write was refused: the lock lapsed to another replica, or
    the batch changed meanwhile (a cancel). The supervisor's pass ends; the next one decides
    again from what Redis holds."""


class BatchStore:
    def __init__(self, redis: Redis, keys: BatchKeys, queue: QueueStore) -> None:
        self._redis = redis
        self.keys = keys
        self.scripts = load_scripts(redis)
        # The gateway's own queue store: lines are admitted by its admit (and its wake-up
        # bound), listed under the batch.
        self._queue = queue

    # -- the API's side ----------------------------------------------------------------------

    async def create(
        self,
        fields: Mapping[str, str | int],
        todo: Sequence[str],
        error_lines: Mapping[int, str],
        created_ms: int,
        *,
        active: bool,
    ) -> None:
        """The batch, its lines to run and its malformed lines, in one MULTI."""
        batch_id, tenant = str(fields["id"]), str(fields["tenant"])
        k = self.keys
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(k.batch(batch_id), mapping=dict[Any, Any](fields))
        for start in range(0, len(todo), _CHUNK):
            pipe.rpush(k.todo(batch_id), *todo[start : start + _CHUNK])
        if error_lines:
            pipe.hset(k.errors(batch_id), mapping={str(n): v for n, v in error_lines.items()})
        pipe.zadd(k.tenant_batches(tenant), {batch_id: created_ms})
        if active:
            pipe.sadd(k.active, batch_id)
        await pipe.execute()

    async def get(self, batch_id: str, tenant: str | None) -> BatchRecord | None:
        """The batch, or None when unknown or another tenant's (tenant None: any tenant)."""
        raw = await self._redis.hgetall(self.keys.batch(batch_id))
        if not raw:
            return None
        record = BatchRecord.from_hash(raw)
        return record if tenant is None or record.tenant == tenant else None

    async def list_page(self, tenant: str, limit: int, after: str | None) -> list[BatchRecord]:
        ids = await self.scripts["list_page"](
            keys=[self.keys.tenant_batches(tenant)], args=[after or "", limit]
        )
        pipe = self._redis.pipeline(transaction=False)
        for batch_id in ids:
            pipe.hgetall(self.keys.batch(redis_text(batch_id)))
        return [BatchRecord.from_hash(h) for h in await pipe.execute() if h]

    async def transition(
        self,
        batch_id: str,
        allowed_from: Sequence[str],
        to_status: str,
        fields: Mapping[str, str | int] | None = None,
        lock_token: str = "",
    ) -> str:
        """'ok' | 'stale' | 'not_found' | the status the batch had (not in allowed_from)."""
        args: list[str | int] = [lock_token, ",".join(allowed_from), to_status]
        for name, value in (fields or {}).items():
            args += [name, value]
        keys = [self.keys.batch(batch_id), self.keys.lock(batch_id)]
        return redis_text(await self.scripts["batch_transition"](keys=keys, args=args))

    # -- the supervisor's side ---------------------------------------------------------------

    async def active_ids(self) -> list[str]:
        return sorted(redis_text(i) for i in await self._redis.smembers(self.keys.active))

    async def try_lock(self, batch_id: str, token: str, lock_ms: int) -> bool:
        return bool(await self._redis.set(self.keys.lock(batch_id), token, nx=True, px=lock_ms))

    async def unlock(self, batch_id: str, token: str) -> None:
        await self.scripts["batch_unlock"](keys=[self.keys.lock(batch_id)], args=[token])

    async def record(self, batch_id: str, line: int, ok: bool, line_json: str, job_id: str) -> bool:
        """Store a line's outcome unless it has one already; True when this call stored it."""
        k = self.keys
        keys = [k.batch(batch_id), k.results(batch_id), k.errors(batch_id), k.open(batch_id)]
        args = [line, "ok" if ok else "error", line_json, job_id]
        return int(await self.scripts["batch_record"](keys=keys, args=args)) == 1

    async def open_jobs(self, batch_id: str) -> list[str]:
        return sorted(redis_text(i) for i in await self._redis.smembers(self.keys.open(batch_id)))

    async def open_count(self, batch_id: str) -> int:
        return int(await self._redis.scard(self.keys.open(batch_id)))

    async def todo_head(self, batch_id: str, count: int) -> list[str]:
        if count < 1:
            return []
        return [
            redis_text(v) for v in await self._redis.lrange(self.keys.todo(batch_id), 0, count - 1)
        ]

    async def pop_todo(self, batch_id: str, count: int) -> None:
        if count > 0:
            await self._redis.ltrim(self.keys.todo(batch_id), count, -1)

    async def todo_count(self, batch_id: str) -> int:
        return int(await self._redis.llen(self.keys.todo(batch_id)))

    async def feed(self, batch_id: str, jobs: Sequence[NewJob]) -> list[AdmitStatus]:
        """Admit line jobs in order (one script call); admitted or duplicate ones become open.

        The caller pops the todo prefix up to the first refusal; a job admitted after a
        refusal stays in the todo list and is found as a duplicate next time.
        """
        if not jobs:
            return []
        k = self.keys
        results = await self._queue.admit_many(jobs, listing_key=k.jobs(batch_id))
        statuses = [result.status for result in results]
        placed = [
            j.job_id for j, s in zip(jobs, statuses, strict=True) if s is not AdmitStatus.QUEUE_FULL
        ]
        if placed:
            await self._redis.sadd(k.open(batch_id), *placed)
        return statuses

    async def job_hashes(self, job_ids: Sequence[str]) -> list[dict[str, Any]]:
        pipe = self._redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(self.keys.queue.job(job_id))
        return list(await pipe.execute())

    async def job_statuses(self, job_ids: Sequence[str]) -> list[str]:
        pipe = self._redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self.keys.queue.job(job_id), "status")
        return [redis_text(s) for s in await pipe.execute()]

    async def outcomes(self, batch_id: str) -> tuple[dict[int, str], dict[int, str]]:
        """(line -> output line, line -> error line)."""
        results = await self._redis.hgetall(self.keys.results(batch_id))
        errors = await self._redis.hgetall(self.keys.errors(batch_id))

        def by_line(raw: Mapping[Any, Any]) -> dict[int, str]:
            return {int(redis_text(n)): redis_text(v) for n, v in raw.items()}

        return by_line(results), by_line(errors)

    async def cleanup(self, batch_id: str) -> None:
        """Drop a terminal batch's working state and its line jobs; it leaves the active set."""
        k = self.keys
        job_ids = [redis_text(i) for i in await self._redis.zrange(k.jobs(batch_id), 0, -1)]
        for start in range(0, len(job_ids), _CHUNK):
            await self._redis.delete(*(k.queue.job(j) for j in job_ids[start : start + _CHUNK]))
        await self._redis.delete(
            k.todo(batch_id),
            k.open(batch_id),
            k.jobs(batch_id),
            k.results(batch_id),
            k.errors(batch_id),
        )
        await self._redis.srem(k.active, batch_id)
