"""Bulk intake against a real redis-server: admits of one tick go in one script call with every
admission guarantee of a lone admit, and a status read never touches the request payload."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.queue import AdmitResult, AdmitStatus, JobStatus, Keys, NewJob, QueueStore
from gateway.queue.coalescer import Coalescer
from policies.request_class import RequestClass

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

B = RequestClass.BULK
T0 = 1_700_000_000_000


def _job(job_id: str, **kw: Any) -> NewJob:
    fields: dict[str, Any] = {
        "tenant": "t1",
        "request_class": B,
        "request_json": json.dumps({"prompt_token_ids": list(range(500)), "model": "m"}),
        "enqueue_ms": T0,
        "cost_tokens": 100,
        "queue_limit": 1000,
        "model": "tiny",
        "created_s": T0 // 1000,
    }
    fields.update(kw)
    return NewJob(job_id=job_id, **fields)


@pytest.fixture
async def store(redis_server: str) -> AsyncIterator[QueueStore]:
    client = aioredis.from_url(redis_server, decode_responses=True)
    try:
        yield QueueStore(client, Keys(f"{{intake-{uuid.uuid4().hex[:8]}}}:"))
    finally:
        await client.aclose()


async def test_admits_of_one_tick_go_in_one_script_call(store: QueueStore) -> None:
    admits: Coalescer[NewJob, AdmitResult] = Coalescer(store.admit_many)
    results = await asyncio.gather(*(admits.call(_job(f"j{i}")) for i in range(50)))
    assert admits.recent_batch_sizes == [50]
    # Each caller got its own answer, in arrival order: the depth after its own step.
    assert [r.status for r in results] == [AdmitStatus.ADMITTED] * 50
    assert [r.depth for r in results] == list(range(1, 51))
    assert (await store.depths())[B].jobs == 50
    assert (await store.depths())[B].queued_tokens == 50 * 100


async def test_a_batch_keeps_the_queue_bound_and_duplicate_check(store: QueueStore) -> None:
    jobs = [_job(f"b{i}", queue_limit=10) for i in range(12)] + [_job("b0", queue_limit=99)]
    results = await store.admit_many(jobs)
    statuses = [r.status for r in results]
    assert statuses == [AdmitStatus.ADMITTED] * 10 + [AdmitStatus.QUEUE_FULL] * 2 + [
        AdmitStatus.DUPLICATE
    ]
    assert await store.get_job_status("b11", "t1") is None
    depths = await store.depths()
    assert depths[B].jobs == 10 and depths[B].queued_tokens == 10 * 100


async def test_arrivals_during_a_call_wait_for_the_next_batch() -> None:
    calls: list[list[int]] = []
    release = asyncio.Event()

    async def call_many(items: Sequence[int]) -> list[int]:
        calls.append(list(items))
        if len(calls) == 1:
            await release.wait()
        return [i * 10 for i in items]

    coalescer: Coalescer[int, int] = Coalescer(call_many)
    first = asyncio.ensure_future(coalescer.call(1))
    while not calls:
        await asyncio.sleep(0)
    later = [asyncio.ensure_future(coalescer.call(i)) for i in (2, 3, 4)]
    await asyncio.sleep(0)
    assert calls == [[1]]  # one call in flight at a time
    release.set()
    assert await first == 10
    assert await asyncio.gather(*later) == [20, 30, 40]
    assert calls == [[1], [2, 3, 4]]


async def test_a_failed_batch_fails_each_caller_and_the_next_batch_runs() -> None:
    failures = iter([True, False])

    async def call_many(items: Sequence[str]) -> list[str]:
        if next(failures):
            raise ConnectionError("redis went away")
        return [s.upper() for s in items]

    coalescer: Coalescer[str, str] = Coalescer(call_many)
    outcomes = await asyncio.gather(
        coalescer.call("a"), coalescer.call("b"), return_exceptions=True
    )
    assert all(isinstance(o, ConnectionError) for o in outcomes)
    assert await coalescer.call("c") == "C"


async def test_status_read_reports_without_the_request(store: QueueStore) -> None:
    await store.admit(_job("s1", deadline_ms=T0 + 5000, custom_id="c-1", metadata_json='{"k":"v"}'))
    # Were the status read to parse the request, this would fail it.
    await store._redis.hset(store.keys.job("s1"), "request", "not json at all")
    view = await store.get_job_status("s1", "t1")
    assert view is not None
    assert (view.status, view.model, view.created_s) == (JobStatus.QUEUED, "tiny", T0 // 1000)
    assert (view.deadline_ms, view.custom_id, view.metadata_json) == (T0 + 5000, "c-1", '{"k":"v"}')
    assert view.attempts == 0 and view.result_json is None
    assert await store.get_job_status("s1", "another-tenant") is None
    assert await store.get_job_status("no-such-job", "t1") is None


async def test_status_reads_of_one_tick_share_one_pipeline(store: QueueStore) -> None:
    await store.admit_many([_job(f"p{i}") for i in range(20)])
    views = await asyncio.gather(*(store.get_job_status(f"p{i}", "t1") for i in range(20)))
    assert [v.job_id for v in views if v is not None] == [f"p{i}" for i in range(20)]
    assert store._status_reads.recent_batch_sizes == [20]


async def test_a_job_stored_before_model_fields_reads_them_from_its_request(
    store: QueueStore,
) -> None:
    await store.admit(_job("old", request_json=json.dumps({"model": "m-old", "created_s": 123})))
    await store._redis.hdel(store.keys.job("old"), "model", "created_s")
    view = await store.get_job_status("old", "t1")
    assert view is not None and (view.model, view.created_s) == ("m-old", 123)
