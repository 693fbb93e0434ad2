"""Queue round trips against a real Redis, for `mixgate bench gateway`.

Phase 1: N admissions (`QueueStore.admit` of a small payload) from `concurrency` workers.
Phase 2: per job, from `concurrency` workers: claim, publish one DELTA and one END, complete,
and read the token stream back to its END. A full round trip is both phases, so round trips/s
is N over the two phases' wall time together.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis

from engine.core.sampling_params import SamplingParams
from gateway.dispatch.stream_event import DELTA, END
from gateway.dispatch.token_stream import TokenStreams
from gateway.queue import JobStatus, Keys, NewJob, QueueStore
from gateway.queue.payload import JobPayload
from policies.request_class import RequestClass

LEASE_MS = 30_000
OFFSETS_MS = {RequestClass.INTERACTIVE: 0, RequestClass.BULK: 0}


@dataclass(frozen=True, slots=True)
class QueueResult:
    admissions_per_s: float
    round_trips_per_s: float
    admit_ms: list[float]
    claim_ms: list[float]


def _payload_json() -> str:
    payload = JobPayload(
        prompt_token_ids=tuple(range(1, 33)),
        sampling=SamplingParams(max_tokens=4, temperature=0.0),
        model="tiny",
        created_s=int(time.time()),
        stream=True,
    )
    return payload.to_json()


async def _run_workers(
    concurrency: int, items: list[str], work: Callable[[str], Awaitable[None]]
) -> float:
    """Run `work` over `items` from `concurrency` workers; returns the wall time in seconds."""
    pending = iter(items)

    async def worker() -> None:
        for item in pending:
            await work(item)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def _delete_prefix(redis: aioredis.Redis, prefix: str) -> None:
    batch: list[bytes] = []
    async for key in redis.scan_iter(match=prefix + "*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            await redis.delete(*batch)
            batch.clear()
    if batch:
        await redis.delete(*batch)


async def run_queue_bench(redis_url: str, admissions: int, concurrency: int) -> QueueResult:
    prefix = f"{{mg-bench-{uuid.uuid4().hex[:8]}}}:"
    redis = aioredis.Redis.from_url(redis_url)
    try:
        keys = Keys(prefix)
        store = QueueStore(redis, keys)
        streams = TokenStreams(redis, keys.out, ttl_s=60)
        request_json = _payload_json()
        ids = [f"bench-{i}" for i in range(admissions)]
        admit_ms: list[float] = []
        claim_ms: list[float] = []

        async def admit(job_id: str) -> None:
            job = NewJob(
                job_id=job_id,
                tenant="bench",
                request_class=RequestClass.INTERACTIVE,
                request_json=request_json,
                enqueue_ms=int(time.time() * 1000),
                cost_tokens=36,
                queue_limit=admissions + 1,
            )
            start = time.perf_counter()
            result = await store.admit(job)
            admit_ms.append((time.perf_counter() - start) * 1000)
            if not result.admitted:
                raise RuntimeError(f"admission of {job_id} refused: {result.status}")

        async def round_trip(_: str) -> None:
            start = time.perf_counter()
            claimed = (
                await store.claim(
                    [RequestClass.INTERACTIVE],
                    int(time.time() * 1000),
                    LEASE_MS,
                    "bench-replica",
                    OFFSETS_MS,
                )
            ).claimed
            claim_ms.append((time.perf_counter() - start) * 1000)
            if claimed is None:
                raise RuntimeError("claim found no job while jobs were queued")
            job_id = claimed.job.job_id
            await streams.publish(job_id, DELTA, {"text": "hi", "token_ids": [1]})
            await streams.publish(job_id, END, {"finish_reason": "length", "usage": {}})
            now_ms = int(time.time() * 1000)
            await store.complete(
                job_id, claimed.lease_token, JobStatus.COMPLETED, "{}", None, now_ms
            )
            events = [event.kind async for event in streams.read(job_id)]
            if events != [DELTA, END]:
                raise RuntimeError(f"stream of {job_id} read back as {events}")

        admit_s = await _run_workers(concurrency, ids, admit)
        rest_s = await _run_workers(concurrency, ids, round_trip)
        await _delete_prefix(redis, prefix)
        return QueueResult(
            admissions_per_s=admissions / admit_s,
            round_trips_per_s=admissions / (admit_s + rest_s),
            admit_ms=admit_ms,
            claim_ms=claim_ms,
        )
    finally:
        await redis.aclose()
