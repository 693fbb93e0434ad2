"""`QueueStore.start`: a job admitted straight into running under one replica's lease, when
nothing of its class waits; afterwards it is a claimed job like any other (renew, complete,
reclaim, cancel). Against fakeredis and a real redis-server, as the other store tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

from gateway.queue import JobRecord, JobStatus, Keys, NewJob, QueueStore
from gateway.queue.store import FIRST_LEASE_TOKEN_MAX, FIRST_LEASE_TOKEN_MIN
from policies.request_class import RequestClass

pytestmark = pytest.mark.anyio

INT, B = RequestClass.INTERACTIVE, RequestClass.BULK
OFFSETS_MS = {INT: 0, B: 30_000}
LEASE_MS = 10_000
T0 = 1_700_000_000_000


def _job(job_id: str, cls: RequestClass = INT, enqueue_ms: int = T0, **kw: Any) -> NewJob:
    fields: dict[str, Any] = {
        "tenant": "t1",
        "request_json": json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        "cost_tokens": 100,
        "queue_limit": 1000,
        "model": "tiny",
        "created_s": T0 // 1000,
    }
    fields.update(kw)
    return NewJob(job_id=job_id, request_class=cls, enqueue_ms=enqueue_ms, **fields)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.redis)])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis]:
    if request.param == "fake":
        c = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    else:
        c = aioredis.from_url(request.getfixturevalue("redis_server"), decode_responses=True)
    try:
        yield c
    finally:
        await c.aclose()


@pytest.fixture
def store(client: aioredis.Redis, keys: Keys) -> QueueStore:
    return QueueStore(client, keys)


async def test_a_started_job_is_stored_as_a_claim_would_leave_it(
    store: QueueStore, client: aioredis.Redis
) -> None:
    started = await store.start(_job("s", deadline_ms=T0 + 60_000), T0 + 5, LEASE_MS, "r1")
    assert started is not None
    # What the caller runs is what Redis holds (no read-back needed).
    stored = await client.hgetall(store.keys.job("s"))
    assert JobRecord.from_hash(stored) == started.job
    assert (started.job.status, started.job.attempts, started.job.replica) == (
        JobStatus.RUNNING,
        1,
        "r1",
    )
    assert started.lease_expiry_ms == T0 + 5 + LEASE_MS
    assert await client.zscore(store.keys.inflight, "s") == T0 + 5 + LEASE_MS
    # The same fields as an admitted job (status polls, listings and reclaim read them all).
    await store.admit(_job("q", B, enqueue_ms=T0 + 1))
    assert set(stored) == set(await client.hgetall(store.keys.job("q")))
    # Never queued: the queue and its token counter do not count it; the tenant lists it.
    depths = await store.depths()
    assert (depths[INT].jobs, depths[INT].queued_tokens) == (0, 0)
    assert [j.job_id for j in await store.list_jobs("t1", 10, None)] == ["q", "s"]
    view = await store.get_job_status("s", "t1")
    assert view is not None and (view.model, view.started_ms) == ("tiny", T0 + 5)


async def test_a_start_never_overtakes_a_queued_job_of_its_class(
    store: QueueStore, client: aioredis.Redis
) -> None:
    await store.admit(_job("waiting", INT))
    assert await store.start(_job("late"), T0 + 1, LEASE_MS, "r1") is None
    assert await client.exists(store.keys.job("late")) == 0
    # Queued bulk work is no reason to wait: the classes have their own slots.
    assert await store.claim([INT], T0 + 2, LEASE_MS, "r1", OFFSETS_MS)
    await store.admit(_job("bulk", B))
    assert await store.start(_job("chat"), T0 + 3, LEASE_MS, "r1") is not None


async def test_a_closed_queue_or_a_passed_deadline_starts_nothing(
    store: QueueStore, client: aioredis.Redis
) -> None:
    assert await store.start(_job("closed", queue_limit=0), T0, LEASE_MS, "r1") is None
    late = _job("late", deadline_ms=T0 - 1)
    assert await store.start(late, T0, LEASE_MS, "r1") is None
    assert await client.exists(store.keys.job("closed"), store.keys.job("late")) == 0


async def test_a_started_job_keeps_every_lease_guarantee(store: QueueStore) -> None:
    started = await store.start(_job("s"), T0, LEASE_MS, "r1")
    assert started is not None
    token = started.lease_token
    assert await store.renew("s", token, T0 + 1, LEASE_MS)
    assert not await store.renew("s", token + 1, T0 + 1, LEASE_MS)
    # Its lease lapses before a token was sent: back to the queue at its enqueue score, and
    # the next claim is a second attempt under a new token; the first holder is fenced out.
    assert (await store.reclaim(T0 + 1 + LEASE_MS)).requeued_ids == ("s",)
    again = (await store.claim([INT], T0 + 2 + LEASE_MS, LEASE_MS, "r2", OFFSETS_MS)).claimed
    assert again is not None and again.job.attempts == 2 and again.lease_token != token
    assert not await store.complete("s", token, JobStatus.COMPLETED, "{}", None, T0 + 3)
    assert await store.complete("s", again.lease_token, JobStatus.COMPLETED, "{}", None, T0 + 3)
    assert not await store.complete("s", again.lease_token, JobStatus.COMPLETED, "{}", None, 0)


async def test_a_start_draws_its_first_lease_token_itself_above_every_claimed_one(
    store: QueueStore, client: aioredis.Redis
) -> None:
    # The fence counter at a value no claim count reaches in practice: the started token is
    # still above it, so a later claim's token can never repeat it.
    await client.set(store.keys.fence, FIRST_LEASE_TOKEN_MIN - 2)
    first = await store.start(_job("a"), T0, LEASE_MS, "r1")
    second = await store.start(_job("b"), T0, LEASE_MS, "r1")
    assert first is not None and second is not None
    for started in (first, second):
        assert FIRST_LEASE_TOKEN_MIN <= started.lease_token <= FIRST_LEASE_TOKEN_MAX
        # Stored digit for digit, as the string that renew and complete compare with.
        stored = await client.hget(store.keys.job(started.job.job_id), "lease_token")
        assert stored == str(started.lease_token)
    assert first.lease_token != second.lease_token
    # The starts left the counter alone (one command fewer per chat than a claim's INCR).
    assert int(await client.get(store.keys.fence)) == FIRST_LEASE_TOKEN_MIN - 2
    await store.admit(_job("c"))
    claimed = (await store.claim([INT], T0 + 1, LEASE_MS, "r1", OFFSETS_MS)).claimed
    assert claimed is not None and claimed.lease_token == FIRST_LEASE_TOKEN_MIN - 1


async def test_a_started_stream_that_sent_tokens_is_failed_not_retried(
    store: QueueStore,
) -> None:
    assert await store.start(_job("s"), T0, LEASE_MS, "r1") is not None
    assert await store.mark_tokens_sent("s")
    assert (await store.reclaim(T0 + LEASE_MS)).failed_ids == ("s",)
    job = await store.get_job("s", "t1")
    assert job is not None and job.error_json is not None
    assert json.loads(job.error_json)["code"] == "lease_lost_after_first_token"


async def test_marking_a_missing_job_leaves_no_hash(
    store: QueueStore, client: aioredis.Redis
) -> None:
    assert not await store.mark_tokens_sent("gone")
    assert await client.exists(store.keys.job("gone")) == 0


async def test_a_started_job_is_cancelled_as_a_claimed_one(
    store: QueueStore, client: aioredis.Redis
) -> None:
    started = await store.start(_job("s"), T0, LEASE_MS, "r1")
    assert started is not None
    assert await store.cancel("s", "t1", T0 + 1) == "cancelling"
    assert await client.exists(store.keys.cancel("s")) == 1
    done = await store.complete("s", started.lease_token, JobStatus.CANCELLED, None, None, T0 + 2)
    # A cancelled job's flag goes with it.
    assert done and await client.exists(store.keys.cancel("s")) == 0
