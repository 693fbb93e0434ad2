"""QueueStore against fakeredis (fast, in-process) and a real redis-server (same tests).

Over 400 lines on purpose: one test section per Lua script of the store (admit, claim, renew,
complete, reclaim, cancel, listing, wake-ups), all on one parametrized pair of backends.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio as aioredis

import gateway.queue
from gateway.queue import (
    AdmitStatus,
    ClaimResult,
    JobStatus,
    Keys,
    NewJob,
    QueueStore,
)
from policies.request_class import RequestClass

pytestmark = pytest.mark.anyio

INT, B = RequestClass.INTERACTIVE, RequestClass.BULK
BOTH = (INT, B)
OFFSETS_MS = {INT: 0, B: 30_000}
LEASE_MS = 10_000
T0 = 1_700_000_000_000  # a realistic epoch-ms clock, to catch float formatting in Lua


def _job(job_id: str, cls: RequestClass = B, enqueue_ms: int = T0, **kw: Any) -> NewJob:
    fields: dict[str, Any] = {
        "tenant": "t1",
        "request_json": json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        "cost_tokens": 100,
        "queue_limit": 1000,
    }
    fields.update(kw)
    return NewJob(job_id=job_id, request_class=cls, enqueue_ms=enqueue_ms, **fields)


def _new_client(backend: str, request: pytest.FixtureRequest) -> aioredis.Redis:
    if backend == "fake":
        return fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
    url: str = request.getfixturevalue("redis_server")
    return aioredis.from_url(url, decode_responses=True)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.redis)])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis]:
    c = _new_client(request.param, request)
    try:
        yield c
    finally:
        await c.aclose()


# `keys` (a random prefix per test) comes from tests/conftest.py.


@pytest.fixture
def store(client: aioredis.Redis, keys: Keys) -> QueueStore:
    return QueueStore(client, keys)


async def _claim(store: QueueStore, now_ms: int, classes: tuple[RequestClass, ...] = BOTH,
                 replica: str = "r1") -> ClaimResult:  # fmt: skip
    return await store.claim(classes, now_ms, LEASE_MS, replica, OFFSETS_MS)


async def _claim_id(store: QueueStore, now_ms: int, **kw: Any) -> str | None:
    result = await _claim(store, now_ms, **kw)
    return None if result.claimed is None else result.claimed.job.job_id


async def _status(store: QueueStore, job_id: str, tenant: str = "t1") -> JobStatus:
    job = await store.get_job(job_id, tenant)
    assert job is not None
    return job.status


# ---- API and validation ----------------------------------------------------------------


def test_all_names_exist() -> None:
    missing = [name for name in gateway.queue.__all__ if not hasattr(gateway.queue, name)]
    assert missing == []
    assert len(set(gateway.queue.__all__)) == len(gateway.queue.__all__)


def test_keys_need_a_hash_tag() -> None:
    assert Keys().job("a") == "{mixgate}:job:a"
    for bad in ("mixgate:", "{}:", "}mixgate{:"):
        with pytest.raises(ValueError, match="hash tag"):
            Keys(prefix=bad)


def test_new_job_validation() -> None:
    with pytest.raises(ValueError, match="job_id"):
        _job("has space")
    with pytest.raises(ValueError, match="deadline_ms"):
        _job("a", deadline_ms=0)
    with pytest.raises(ValueError, match="max_attempts"):
        _job("a", max_attempts=0)


# ---- admit -------------------------------------------------------------------------------


async def test_admit_duplicate_and_queue_full(store: QueueStore) -> None:
    first = await store.admit(_job("a", queue_limit=2))
    assert (first.status, first.depth) == (AdmitStatus.ADMITTED, 1)
    dup = await store.admit(_job("a", queue_limit=2, request_json="{}"))
    assert (dup.status, dup.depth) == (AdmitStatus.DUPLICATE, 1)
    assert (await store.get_job("a", "t1")) is not None
    assert (await store.admit(_job("b", queue_limit=2))).depth == 2
    full = await store.admit(_job("c", queue_limit=2))
    assert (full.status, full.depth, full.admitted) == (AdmitStatus.QUEUE_FULL, 2, False)
    assert await store.get_job("c", "t1") is None
    # The bound is per class: the interactive queue is still empty.
    assert (await store.admit(_job("d", INT, queue_limit=2))).admitted


async def test_admit_stores_every_field(store: QueueStore) -> None:
    await store.admit(_job("a", INT, deadline_ms=T0 + 5000, custom_id="c-1",
                           metadata_json='{"k": "v"}', max_attempts=2))  # fmt: skip
    job = await store.get_job("a", "t1")
    assert job is not None
    assert (job.request_class, job.status, job.enqueue_ms) == (INT, JobStatus.QUEUED, T0)
    assert (job.deadline_ms, job.custom_id, job.metadata_json) == (T0 + 5000, "c-1", '{"k": "v"}')
    assert (job.attempts, job.max_attempts, job.lease_token, job.started_ms) == (0, 2, None, None)
    assert json.loads(job.request_json)["messages"][0]["content"] == "hi"


async def test_status_reads_answer_every_job_in_order_past_one_script_slice(
    store: QueueStore,
) -> None:
    # More ids than one statuses.lua call takes, unknown ones among them: every answer in the
    # caller's order, None for the unknown, the stored fields for the rest.
    count = gateway.queue.store.STATUS_READS_PER_SCRIPT + 40
    await store.admit_many(
        [
            _job(f"j{i}", INT if i % 2 else B, enqueue_ms=T0 + i, custom_id=f"c{i}")
            for i in range(count)
        ]
    )
    ids = [f"j{i}" if i % 7 else f"missing{i}" for i in range(count)]
    views = await store.job_statuses(ids)
    assert len(views) == count
    for i, view in enumerate(views):
        if i % 7 == 0:
            assert view is None
            continue
        assert view is not None
        assert (view.job_id, view.enqueue_ms, view.custom_id) == (f"j{i}", T0 + i, f"c{i}")
        assert view.request_class == (INT if i % 2 else B)
        assert view.status == JobStatus.QUEUED
    assert await store.job_statuses([]) == []


# ---- claim -------------------------------------------------------------------------------


async def test_claim_is_fifo_within_a_class(store: QueueStore) -> None:
    for n, job_id in enumerate(["x", "y", "z"]):
        await store.admit(_job(job_id, INT, enqueue_ms=T0 + n))
    got = [await _claim_id(store, T0 + 10) for _ in range(4)]
    assert got == ["x", "y", "z", None]


@pytest.mark.parametrize(("bulk_age_ms", "winner"), [(30_001, "bulk"), (29_999, "chat")])
async def test_claim_ages_bulk_linearly(store: QueueStore, bulk_age_ms: int, winner: str) -> None:
    now = T0 + 100_000
    await store.admit(_job("bulk", B, enqueue_ms=now - bulk_age_ms))
    await store.admit(_job("chat", INT, enqueue_ms=now))
    assert await _claim_id(store, now) == winner


async def test_claim_only_the_asked_classes(store: QueueStore) -> None:
    await store.admit(_job("old-bulk", B, enqueue_ms=T0 - 60_000))
    await store.admit(_job("chat", INT, enqueue_ms=T0))
    # Bulk slots are full: the older bulk job must stay queued.
    assert await _claim_id(store, T0, classes=(INT,)) == "chat"
    assert await _claim_id(store, T0, classes=(INT,)) is None
    assert await _status(store, "old-bulk") == JobStatus.QUEUED
    assert (await store.claim((), T0, LEASE_MS, "r1", OFFSETS_MS)).claimed is None


async def test_claim_sets_the_lease(store: QueueStore, client: aioredis.Redis) -> None:
    await store.admit(_job("a", INT))
    claimed = (await _claim(store, T0 + 7, replica="r9")).claimed
    assert claimed is not None
    job = claimed.job
    assert (job.status, job.attempts, job.replica, job.started_ms) == ("running", 1, "r9", T0 + 7)
    assert job.lease_token == claimed.lease_token
    assert claimed.lease_expiry_ms == T0 + 7 + LEASE_MS
    assert await client.zscore(store.keys.inflight, "a") == T0 + 7 + LEASE_MS


async def test_claim_drops_expired_jobs(store: QueueStore) -> None:
    await store.admit(_job("late", INT, enqueue_ms=T0, deadline_ms=T0 + 50))
    await store.admit(_job("ok", INT, enqueue_ms=T0 + 1, deadline_ms=T0 + 5000))
    result = await _claim(store, T0 + 100)
    assert result.claimed is not None and result.claimed.job.job_id == "ok"
    assert result.expired_ids == ("late",)
    late = await store.get_job("late", "t1")
    assert late is not None and late.status == JobStatus.EXPIRED and late.finished_ms == T0 + 100
    assert late.error_json is not None and json.loads(late.error_json)["code"] == "deadline_expired"
    # A deadline exactly now is still feasible to start.
    await store.admit(_job("edge", INT, deadline_ms=T0 + 200))
    assert await _claim_id(store, T0 + 200) == "edge"


async def test_claim_scan_is_bounded(client: aioredis.Redis, keys: Keys) -> None:
    store = QueueStore(client, keys, claim_scan_max=2)
    for n in range(3):
        await store.admit(_job(f"e{n}", B, enqueue_ms=T0 + n, deadline_ms=T0 + 10))
    await store.admit(_job("live", B, enqueue_ms=T0 + 5))
    first = await _claim(store, T0 + 1000)
    assert (first.claimed, first.expired_ids) == (None, ("e0", "e1"))
    second = await _claim(store, T0 + 1000)
    assert second.claimed is not None and second.claimed.job.job_id == "live"
    assert second.expired_ids == ("e2",)


# ---- renew, complete, reclaim ------------------------------------------------------------


async def test_renew_needs_the_current_token(store: QueueStore, client: aioredis.Redis) -> None:
    await store.admit(_job("a"))
    claimed = (await _claim(store, T0)).claimed
    assert claimed is not None
    assert await store.renew("a", claimed.lease_token + 1, T0 + 5000, LEASE_MS) is False
    assert await store.renew("a", claimed.lease_token, T0 + 5000, LEASE_MS) is True
    assert await client.zscore(store.keys.inflight, "a") == T0 + 5000 + LEASE_MS
    assert await store.renew("missing", 1, T0, LEASE_MS) is False
    # A lease that is no longer tracked could never be reclaimed again: renewing it is refused.
    await client.zrem(store.keys.inflight, "a")
    assert await store.renew("a", claimed.lease_token, T0 + 6000, LEASE_MS) is False


async def test_complete_is_fenced(store: QueueStore) -> None:
    await store.admit(_job("a"))
    old = (await _claim(store, T0, replica="r1")).claimed
    assert old is not None
    # r1 stalls past its lease; the sweep requeues the job and r2 takes it.
    assert (await store.reclaim(T0 + LEASE_MS)).requeued_ids == ("a",)
    new = (await _claim(store, T0 + LEASE_MS + 1, replica="r2")).claimed
    assert new is not None and new.lease_token > old.lease_token
    assert not await store.complete("a", old.lease_token, JobStatus.COMPLETED, '"r1"', None, T0)
    assert not await store.renew("a", old.lease_token, T0 + LEASE_MS + 2, LEASE_MS)
    assert await store.complete("a", new.lease_token, JobStatus.COMPLETED, '"r2"', None, T0 + 1)
    # Twice, even with the right token, is refused: the first result stands.
    assert not await store.complete("a", new.lease_token, JobStatus.FAILED, None, '"x"', T0 + 2)
    job = await store.get_job("a", "t1")
    assert job is not None
    assert (job.status, job.result_json, job.error_json) == ("completed", '"r2"', None)
    assert (job.attempts, job.replica, job.finished_ms) == (2, "r2", T0 + 1)
    with pytest.raises(ValueError, match="completed as one of"):
        await store.complete("a", new.lease_token, JobStatus.EXPIRED, None, None, T0)


async def test_reclaim_requeues_at_the_original_score(
    store: QueueStore, client: aioredis.Redis
) -> None:
    await store.admit(_job("a", B, enqueue_ms=T0))
    await _claim(store, T0)
    assert (await store.reclaim(T0 + LEASE_MS - 1)).requeued_ids == ()
    result = await store.reclaim(T0 + LEASE_MS)
    assert (result.requeued_ids, result.failed_ids) == (("a",), ())
    assert await client.zscore(store.keys.pending(B), "a") == T0
    assert await client.zscore(store.keys.inflight, "a") is None
    assert (await store.depths())[B].queued_tokens == 100
    # It kept its age: it still beats a fresh interactive job under aging.
    await store.admit(_job("chat", INT, enqueue_ms=T0 + 40_000))
    assert await _claim_id(store, T0 + 40_000) == "a"


async def test_reclaim_fails_after_max_attempts(store: QueueStore) -> None:
    await store.admit(_job("a", max_attempts=2))
    now = T0
    for attempt in (1, 2):
        claimed = (await _claim(store, now)).claimed
        assert claimed is not None and claimed.job.attempts == attempt
        now += LEASE_MS
        result = await store.reclaim(now)
    assert (result.requeued_ids, result.failed_ids) == ((), ("a",))
    job = await store.get_job("a", "t1")
    assert job is not None and job.status == JobStatus.FAILED and job.error_json is not None
    assert json.loads(job.error_json)["code"] == "max_attempts_exceeded"
    assert await _claim_id(store, now) is None


async def test_reclaim_fails_interactive_that_sent_tokens(store: QueueStore) -> None:
    for job_id, cls in (("chat", INT), ("bulk", B)):
        await store.admit(_job(job_id, cls))
        await _claim(store, T0)
        assert await store.mark_tokens_sent(job_id)
    result = await store.reclaim(T0 + LEASE_MS, limit=10)
    # A retried stream would repeat tokens to the user; a bulk job's result is written once.
    assert (result.failed_ids, result.requeued_ids) == (("chat",), ("bulk",))
    job = await store.get_job("chat", "t1")
    assert job is not None and job.tokens_sent and job.error_json is not None
    assert json.loads(job.error_json)["code"] == "lease_lost_after_first_token"
    assert not await store.mark_tokens_sent("nope")
    assert await store.get_job("nope", "t1") is None


async def test_reclaim_is_bounded_and_cancels_flagged(store: QueueStore) -> None:
    for n in range(3):
        await store.admit(_job(f"j{n}", enqueue_ms=T0 + n))
        await _claim(store, T0 + n)
    assert await store.cancel("j0", "t1", T0 + 5) == "cancelling"
    first = await store.reclaim(T0 + LEASE_MS + 10, limit=2)
    assert (first.cancelled_ids, first.requeued_ids) == (("j0",), ("j1",))
    assert (await store.reclaim(T0 + LEASE_MS + 10, limit=2)).requeued_ids == ("j2",)
    assert await _status(store, "j0") == JobStatus.CANCELLED


# ---- cancel ------------------------------------------------------------------------------


async def test_cancel_queued(store: QueueStore) -> None:
    await store.admit(_job("a", INT))
    assert await store.cancel("a", "t1", T0 + 3) == "cancelled"
    assert await _status(store, "a") == JobStatus.CANCELLED
    assert await _claim_id(store, T0 + 4) is None
    assert (await store.depths())[INT].jobs == 0
    # Cancelling again reports the terminal status, unchanged.
    assert await store.cancel("a", "t1", T0 + 5) == "cancelled"


async def _next_message(pubsub: Any, timeout_s: float = 30.0) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if msg is not None:
            return dict(msg)
    return None


async def test_cancel_running_sets_flag_and_publishes(
    store: QueueStore, client: aioredis.Redis
) -> None:
    await store.admit(_job("a", INT))
    claimed = (await _claim(store, T0)).claimed
    assert claimed is not None
    pubsub = client.pubsub()
    try:
        await pubsub.subscribe(store.keys.cancel_channel)
        assert await store.cancel("a", "t1", T0 + 1) == "cancelling"
        msg = await _next_message(pubsub)
    finally:
        await pubsub.aclose()
    assert msg is not None and msg["data"] == "a"
    assert await client.get(store.keys.cancel("a")) == "1"
    assert 0 < await client.pttl(store.keys.cancel("a")) <= 3_600_000
    assert await _status(store, "a") == JobStatus.RUNNING
    ok = await store.complete("a", claimed.lease_token, JobStatus.CANCELLED, None, None, T0 + 2)
    assert ok and await client.exists(store.keys.cancel("a")) == 0
    assert await store.cancel("a", "t1", T0 + 3) == "cancelled"


async def test_cancel_terminal_other_tenant_and_unknown(store: QueueStore) -> None:
    await store.admit(_job("a"))
    claimed = (await _claim(store, T0)).claimed
    assert claimed is not None
    assert await store.complete("a", claimed.lease_token, JobStatus.COMPLETED, "{}", None, T0)
    assert await store.cancel("a", "t1", T0) == "completed"
    await store.admit(_job("b"))
    assert await store.cancel("b", "t2", T0) == "not_found"
    assert await _status(store, "b") == JobStatus.QUEUED
    assert await store.cancel("nope", "t1", T0) == "not_found"


# ---- counters, records, listing ----------------------------------------------------------


async def test_queued_tokens_return_to_zero(store: QueueStore) -> None:
    await store.admit(_job("a", INT, cost_tokens=70))
    await store.admit(_job("b", B, cost_tokens=500))
    await store.admit(_job("c", B, cost_tokens=30))
    depths = await store.depths()
    assert (depths[INT].jobs, depths[INT].queued_tokens) == (1, 70)
    assert (depths[B].jobs, depths[B].queued_tokens) == (2, 530)
    assert await _claim_id(store, T0) == "a"
    assert await store.cancel("b", "t1", T0) == "cancelled"
    await store.admit(_job("d", B, enqueue_ms=T0 - 1, cost_tokens=9, deadline_ms=T0 + 1))
    result = await _claim(store, T0 + 10)  # drops expired "d", then claims "c"
    assert result.expired_ids == ("d",)
    depths = await store.depths()
    assert [(d.jobs, d.queued_tokens) for d in depths.values()] == [(0, 0), (0, 0)]


async def test_get_job_is_tenant_isolated(store: QueueStore) -> None:
    await store.admit(_job("a", tenant="t1"))
    mine = await store.get_job("a", "t1")
    assert mine is not None and mine.tenant == "t1"
    assert await store.get_job("a", "t2") is None
    assert await store.get_job("missing", "t1") is None


async def test_list_jobs_pages_newest_first(store: QueueStore) -> None:
    for n in range(5):
        await store.admit(_job(f"j{n}", enqueue_ms=T0 + n))
    await store.admit(_job("other", tenant="t2", enqueue_ms=T0 + 99))
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        page = await store.list_jobs("t1", limit=2, after=after)
        if not page:
            break
        pages.append([j.job_id for j in page])
        after = page[-1].job_id
    assert pages == [["j4", "j3"], ["j2", "j1"], ["j0"]]
    # Another tenant's id is not a valid cursor.
    assert await store.list_jobs("t1", limit=2, after="other") == []


async def test_a_listing_reads_status_fields_never_the_request(store: QueueStore) -> None:
    # A poller pages through every outstanding job; the request (the tokenized prompt) is most
    # of each hash. The listing must not read it: a job whose stored request is unreadable
    # still lists, with the model and created time its status fields hold.
    await store.admit(_job("a", model="tiny", created_s=1_700_000_000, request_json="{not json"))
    await store.admit(_job("b", enqueue_ms=T0 + 1, model="tiny", created_s=1_700_000_001))
    listed = await store.list_jobs("t1", limit=10, after=None)
    assert [(v.job_id, v.model, v.created_s, v.status) for v in listed] == [
        ("b", "tiny", 1_700_000_001, JobStatus.QUEUED),
        ("a", "tiny", 1_700_000_000, JobStatus.QUEUED),
    ]


# ---- wake-ups ----------------------------------------------------------------------------


async def _blocked_clients(client: aioredis.Redis) -> int:
    return int((await client.info("clients"))["blocked_clients"])


async def _until_blocked(client: aioredis.Redis, count: int) -> None:
    """Until the server holds `count` blocked clients (a condition, not a sleep)."""
    async with asyncio.timeout(30.0):
        while await _blocked_clients(client) < count:
            await asyncio.sleep(0.005)


async def test_a_wait_for_work_wakes_on_admit(client: aioredis.Redis, keys: Keys) -> None:
    store = QueueStore(client, keys)
    assert await store.wake_ups.wait(BOTH, 0.05) is None
    # fakeredis has no INFO; against it the admit may land before the BZPOPMIN, which then
    # pops the admit's marker at once: still "woken by the admit", through the other path.
    real_server = not isinstance(client, fakeredis.FakeAsyncRedis)
    blocked_before = await _blocked_clients(client) if real_server else 0
    # A timeout far past the test's own bounds: True can only mean the admit woke it.
    waiter = asyncio.create_task(store.wake_ups.wait(BOTH, 120.0))
    if real_server:
        # The BZPOPMIN must be blocked on the server before the admit, or the blocked
        # wake-up is not what is tested: wait for the server to say so.
        await _until_blocked(client, blocked_before + 1)
    assert not waiter.done()
    await store.admit(_job("a"))
    assert await asyncio.wait_for(waiter, 30.0) is not None


async def test_wake_markers_are_bounded(client: aioredis.Redis, keys: Keys) -> None:
    store = QueueStore(client, keys, wake_max=3)
    for n in range(6):
        await store.admit(_job(f"j{n}", enqueue_ms=T0 + n))
    assert await client.zcard(keys.wake(B)) == 3
    assert await client.zcard(keys.wake(INT)) == 0
    assert [await store.wake_ups.wait(BOTH, 0.05) is not None for _ in range(4)] == [
        True,
        True,
        True,
        False,
    ]


async def test_a_wake_up_goes_to_a_waiter_of_its_class(client: aioredis.Redis, keys: Keys) -> None:
    # Role-split replicas: one runs bulk only, one chats only. With one wake-up key for both
    # classes, the longest-blocked waiter took every wake-up: a bulk-only replica swallowed a
    # chat's and the chat replica slept on until its wait timed out (1 s), and bulk
    # submissions woke chat replicas for claims that could find nothing.
    store = QueueStore(client, keys)
    await store.admit(_job("j1", INT))
    await store.admit(_job("j2", B))
    assert await store.wake_ups.wait([B], 0.05) is not None  # the bulk marker
    assert await store.wake_ups.wait([B], 0.05) is None  # the chat's is not bulk's to take
    assert await store.wake_ups.wait([INT], 0.05) is not None
    if isinstance(client, fakeredis.FakeAsyncRedis):
        return
    # Blocked waiters on a real server, the bulk-only one first (Redis serves the longest
    # blocked client first): a chat's admit wakes the chat waiter and leaves the bulk one.
    blocked_before = await _blocked_clients(client)
    bulk_waiter = asyncio.create_task(store.wake_ups.wait([B], 120.0))
    await _until_blocked(client, blocked_before + 1)
    chat_waiter = asyncio.create_task(store.wake_ups.wait([INT], 120.0))
    await _until_blocked(client, blocked_before + 2)
    await store.admit(_job("j3", INT))
    assert await asyncio.wait_for(chat_waiter, 30.0) is not None
    assert not bulk_waiter.done()
    await store.admit(_job("j4", B))
    assert await asyncio.wait_for(bulk_waiter, 30.0) is not None


async def test_reclaim_wakes_the_class_of_the_requeued_job(
    client: aioredis.Redis, keys: Keys
) -> None:
    store = QueueStore(client, keys)
    await store.admit(_job("c1", INT))
    assert await _claim_id(store, T0) == "c1"
    # The claim that emptied the queue took the admit's marker with it; then the lease
    # lapses and the sweep requeues the chat.
    assert await store.wake_ups.wait([INT], 0.05) is None
    result = await store.reclaim(T0 + LEASE_MS + 1)
    assert result.requeued_ids == ("c1",)
    assert await client.zcard(keys.wake(B)) == 0
    assert await store.wake_ups.wait([INT], 0.05) is not None


async def test_a_claim_that_empties_a_queue_forgets_its_wake_ups(
    client: aioredis.Redis, keys: Keys
) -> None:
    # Markers of work that is gone would each cost an idle replica a claim that finds nothing.
    store = QueueStore(client, keys)
    for n in range(2):
        await store.admit(_job(f"b{n}", B, enqueue_ms=T0 + n))
    await store.admit(_job("c0", INT))
    assert await _claim_id(store, T0, classes=(B,)) == "b0"
    assert await client.zcard(keys.wake(B)) == 2  # b1 is still queued
    assert await _claim_id(store, T0, classes=(B,)) == "b1"
    assert await client.zcard(keys.wake(B)) == 0
    assert await client.zcard(keys.wake(INT)) == 1  # not asked: untouched
    # A claim that finds nothing at all forgets the asked empty classes' markers too.
    await client.zadd(keys.wake(B), {"stale": T0})
    assert await _claim_id(store, T0, classes=(B,)) is None
    assert await client.zcard(keys.wake(B)) == 0


async def test_a_passed_on_wake_up_is_there_for_the_next_waiter(
    client: aioredis.Redis, keys: Keys
) -> None:
    store = QueueStore(client, keys)
    await store.admit(_job("c1", INT, enqueue_ms=T0 + 7))
    wake_up = await store.wake_ups.wait([INT], 0.05)
    assert wake_up is not None
    assert (wake_up.request_class, wake_up.member, wake_up.score) == (INT, "c1", T0 + 7)
    assert await store.wake_ups.wait(BOTH, 0.05) is None
    await store.wake_ups.pass_on(wake_up)
    assert await store.wake_ups.wait(BOTH, 0.05) == wake_up


# ---- races on a real server --------------------------------------------------------------


@pytest.mark.redis
async def test_concurrent_claimers_claim_each_job_once(redis_server: str, keys: Keys) -> None:
    clients = [aioredis.from_url(redis_server, decode_responses=True) for _ in range(4)]
    try:
        admitter = QueueStore(clients[0], keys)
        job_ids = [f"j{n:03d}" for n in range(200)]
        for n, job_id in enumerate(job_ids):
            await admitter.admit(_job(job_id, BOTH[n % 2], enqueue_ms=T0 + n))

        async def drain(store: QueueStore, replica: str) -> list[tuple[str, int]]:
            got: list[tuple[str, int]] = []
            while claimed := (await _claim(store, T0 + 500, replica=replica)).claimed:
                got.append((claimed.job.job_id, claimed.lease_token))
            return got

        results = await asyncio.gather(
            *(drain(QueueStore(c, keys), f"r{n}") for n, c in enumerate(clients[1:]))
        )
    finally:
        for c in clients:
            await c.aclose()
    claimed_ids = [job_id for got in results for job_id, _ in got]
    tokens = [token for got in results for _, token in got]
    assert sorted(claimed_ids) == job_ids
    assert len(set(tokens)) == len(tokens) == 200


async def test_works_with_a_bytes_client(keys: Keys) -> None:
    # The store must not depend on decode_responses=True (the default client returns bytes).
    client = fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer())
    try:
        store = QueueStore(client, keys)
        await store.admit(_job("a", INT, cost_tokens=5))
        claimed = (await _claim(store, T0)).claimed
        assert claimed is not None and claimed.job.job_id == "a"
        assert claimed.job.request_class is INT
        listed = await store.list_jobs("t1", limit=5, after=None)
        assert [j.status for j in listed] == [JobStatus.RUNNING]
        assert (await store.depths())[INT].queued_tokens == 0
    finally:
        await client.aclose()
