"""Dispatcher against a real redis-server and a real engine on the tiny model (no mocks).

Each test has its own key prefix on the shared server. Waits are on stream events or on the
dispatcher's drain-and-return mode, never on sleeps. Over 400 lines on purpose: one concept (the
dispatcher's contract: runs, cancellation, leases, drain) over one real-Redis + engine set-up
that every section uses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any, cast

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest, RequestOutput
from engine.core.sampling_params import SamplingParams
from engine.process.async_engine import AsyncEngine
from gateway.dispatch.config import DispatcherConfig
from gateway.dispatch.dispatcher import Dispatcher
from gateway.dispatch.events import DispatchEvent, DispatchEventKind
from gateway.dispatch.local_delivery import WATCHED_KEY
from gateway.dispatch.retry import Backoff, retry_transient
from gateway.dispatch.stream_event import DELTA, END, ERROR, StreamEvent
from gateway.dispatch.token_stream import TokenStreams
from gateway.queue import JobRecord, JobStatus, Keys, NewJob, QueueStore
from gateway.queue.payload import JobPayload
from policies.request_class import RequestClass

pytestmark = pytest.mark.anyio

INT, B = RequestClass.INTERACTIVE, RequestClass.BULK
TENANT = "t1"
OFFSETS_MS = {INT: 0, B: 30_000}
K = DispatchEventKind
StepHold = Callable[[int], Callable[[], None]]


class FakeClock:
    """A wall clock in ms that only moves when the test says so."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def _now_ms() -> int:
    return int(time.time() * 1000)


def _make_engine(model_dir: Path) -> AsyncEngine:
    config = EngineConfig(
        max_active_seqs=8,
        step_token_budget=256,
        num_kv_blocks=256,
        block_size_tokens=16,
        device="cpu",
        dtype="float32",
    )
    return AsyncEngine(LLMEngine(model_dir, config))


@pytest.fixture(scope="module")
async def engine(tiny_model_dir: Path) -> AsyncIterator[AsyncEngine]:
    # One engine for the module (loading it is the slow part); every test leaves it idle.
    eng = _make_engine(tiny_model_dir)
    await eng.start()
    try:
        yield eng
    finally:
        await eng.stop()


@pytest.fixture
def client(aclient: aioredis.Redis) -> aioredis.Redis:
    # This file's name for conftest's client; `keys` (a random prefix per test) is conftest's.
    return aclient


@pytest.fixture
def store(client: aioredis.Redis, keys: Keys) -> QueueStore:
    return QueueStore(client, keys)


@pytest.fixture
def streams(client: aioredis.Redis, keys: Keys) -> TokenStreams:
    return TokenStreams(client, keys.out, ttl_s=600)


def _config(interactive: int = 4, bulk: int = 4, **kw: Any) -> DispatcherConfig:
    return DispatcherConfig(
        replica_id=kw.pop("replica_id", "r1"),
        max_active_by_class={INT: interactive, B: bulk},
        class_offsets_ms=OFFSETS_MS,
        **kw,
    )


def _prompt(i: int, n: int = 5) -> tuple[int, ...]:
    return tuple(65 + (i * 7 + j) % 26 for j in range(n))


async def _admit(
    store: QueueStore,
    cls: RequestClass,
    max_tokens: int,
    *,
    prompt: tuple[int, ...] = (72, 105, 33),
    enqueue_ms: int | None = None,
    deadline_ms: int | None = None,
) -> str:
    job = _new_job(cls, max_tokens, prompt=prompt, enqueue_ms=enqueue_ms, deadline_ms=deadline_ms)
    assert (await store.admit(job)).admitted
    return job.job_id


def _new_job(
    cls: RequestClass,
    max_tokens: int,
    *,
    prompt: tuple[int, ...] = (72, 105, 33),
    enqueue_ms: int | None = None,
    deadline_ms: int | None = None,
) -> NewJob:
    job_id = f"job-{uuid.uuid4().hex[:10]}"
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    # Marked as read (as chats are): these tests read every job's stream.
    payload = JobPayload(
        prompt_token_ids=prompt,
        sampling=sampling,
        model="tiny",
        created_s=0,
        extra={WATCHED_KEY: True},
    )
    return NewJob(
        job_id=job_id,
        tenant=TENANT,
        request_class=cls,
        request_json=payload.to_json(),
        enqueue_ms=_now_ms() if enqueue_ms is None else enqueue_ms,
        cost_tokens=payload.cost_tokens,
        queue_limit=1000,
        deadline_ms=deadline_ms,
    )


async def _record(store: QueueStore, job_id: str) -> JobRecord:
    record = await store.get_job(job_id, TENANT)
    assert record is not None
    return record


async def _events(streams: TokenStreams, job_id: str, timeout_s: float = 20.0) -> list[StreamEvent]:
    """Every event of the job's stream, up to its last one."""
    events: list[StreamEvent] = []
    reader = cast(AsyncGenerator[StreamEvent, None], streams.read(job_id, block_ms=200))
    async with asyncio.timeout(timeout_s), aclosing(reader):
        async for event in reader:
            events.append(event)
    return events


async def _first_event(streams: TokenStreams, job_id: str) -> StreamEvent:
    reader = cast(AsyncGenerator[StreamEvent, None], streams.read(job_id, block_ms=200))
    async with asyncio.timeout(20.0), aclosing(reader):
        async for event in reader:
            return event
    raise AssertionError("the stream ended without an event")


async def _kinds_so_far(client: aioredis.Redis, keys: Keys, job_id: str) -> list[str]:
    entries: Any = await client.xrange(keys.out(job_id))
    return [fields["e"] for _, fields in entries]


def _blocks_free_now(engine: AsyncEngine) -> bool:
    manager = engine.engine.block_manager
    return manager.num_free_blocks == manager.num_blocks


@pytest.fixture
def hold_steps(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[StepHold]:
    """`hold(n)`: the engine thread takes no step until n requests are in it, and once each has
    produced a token it takes no further step until something is aborted or the returned
    `release()` is called, so which jobs are still running at that point does not depend on
    how fast the engine thread runs against the test's event loop. (Holding only the second
    part, a 40-token job claimed first could finish before the last one was handed over: a CI
    run saw finished 2, not 3.)"""
    release = threading.Event()
    real_step, real_abort = engine.engine.step, engine.abort
    real_add = engine.engine.add_request
    wakeup = engine._wakeup  # noqa: SLF001 - set by every submission to the engine thread

    def hold(requests: int) -> Callable[[], None]:
        added: set[str] = set()
        with_tokens: set[str] = set()

        def add_request(request: GenerationRequest) -> None:
            real_add(request)
            added.add(request.request_id)

        def step() -> list[RequestOutput]:
            if len(added) < requests:
                # Wait for the next submission; the engine loop adds it before its next step.
                wakeup.wait()
                wakeup.clear()
                return []
            if len(with_tokens) >= requests:
                release.wait()
            outputs = real_step()
            with_tokens.update(o.request_id for o in outputs if o.new_token_ids)
            return outputs

        def abort(request_id: str) -> None:
            release.set()
            real_abort(request_id)

        monkeypatch.setattr(engine.engine, "add_request", add_request)
        monkeypatch.setattr(engine.engine, "step", step)
        monkeypatch.setattr(engine, "abort", abort)
        return release.set

    yield hold
    # Never leave the module's engine thread waiting (a failed test may not have aborted, or
    # not have handed every job over).
    release.set()
    wakeup.set()


async def _all_blocks_free(engine: AsyncEngine, within_s: float = 30.0) -> bool:
    """Free blocks back to the total within `within_s` (the abort runs on the engine thread;
    the bound is generous, a deadline for a hang, not a speed requirement)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not _blocks_free_now(engine):
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


# ---- runs ----------------------------------------------------------------------------------


@pytest.mark.redis
async def test_jobs_of_both_classes_complete_once(
    engine: AsyncEngine, client: aioredis.Redis, store: QueueStore, streams: TokenStreams
) -> None:
    jobs: dict[str, tuple[RequestClass, tuple[int, ...], int]] = {}
    for i in range(6):
        cls = INT if i % 2 else B
        prompt, max_tokens = _prompt(i, 3 + i), 6 + i
        jobs[await _admit(store, cls, max_tokens, prompt=prompt)] = (cls, prompt, max_tokens)
    finished: list[tuple[RequestClass, str, dict[str, object] | None]] = []
    dispatcher = Dispatcher(
        store,
        streams,
        engine,
        _config(),
        redis=client,
        on_finished=lambda cls, status, timings: finished.append((cls, status, timings)),
    )

    await dispatcher.run_until_idle()

    for job_id, (cls, prompt, max_tokens) in jobs.items():
        record = await _record(store, job_id)
        assert record.status is JobStatus.COMPLETED
        assert record.attempts == 1
        assert record.tokens_sent is (cls is INT)
        assert record.result_json is not None
        result = json.loads(record.result_json)
        events = await _events(streams, job_id)
        assert [e.kind for e in events] == [DELTA] * (len(events) - 1) + [END]
        deltas = events[:-1]
        assert "".join(e.data["text"] for e in deltas) == result["text"]
        token_ids = [t for e in deltas for t in e.data["token_ids"]]
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": max_tokens,
            "total_tokens": len(prompt) + max_tokens,
        }
        assert len(token_ids) == max_tokens
        assert result["usage"] == usage == events[-1].data["usage"]
        assert result["finish_reason"] == events[-1].data["finish_reason"] == "length"
        timings = events[-1].data["timings"]
        assert 0 <= timings["queue_s"] <= timings["ttft_s"] <= timings["e2e_s"]
        # The queue delay's first two parts: to the engine, and into the engine core.
        assert timings["dispatch_s"] >= 0
        assert timings["accept_s"] >= 0
        assert timings["dispatch_s"] + timings["accept_s"] <= timings["queue_s"] + 1e-9
    for cls in (INT, B):
        assert dispatcher.counters.count(K.CLAIMED, cls) == 3
        assert dispatcher.counters.count(K.COMPLETED, cls) == 3
    assert dispatcher.in_flight() == {INT: 0, B: 0}
    # What the metrics module observes: one terminal status per job, with its timings.
    assert sorted((cls, status) for cls, status, _ in finished) == sorted(
        (cls, "completed") for cls, _, _ in jobs.values()
    )
    for _, _, timings in finished:
        assert timings is not None
        itls_s = timings["itls_s"]
        assert isinstance(itls_s, list) and len(itls_s) >= 5


@pytest.mark.redis
async def test_claim_loop_respects_max_active_by_class(
    engine: AsyncEngine, client: aioredis.Redis, store: QueueStore, streams: TokenStreams
) -> None:
    job_ids = [await _admit(store, B, 12) for _ in range(5)]
    bulk_in_flight_at_claims: list[int] = []
    dispatcher: Dispatcher

    def on_event(event: DispatchEvent) -> None:
        if event.kind is K.CLAIMED:
            bulk_in_flight_at_claims.append(dispatcher.in_flight()[B])

    dispatcher = Dispatcher(
        store, streams, engine, _config(interactive=4, bulk=1), redis=client, on_event=on_event
    )
    await dispatcher.run_until_idle()

    # Each claim counts itself: with one bulk slot, every claim found the slot empty.
    assert bulk_in_flight_at_claims == [1] * 5
    for job_id in job_ids:
        assert (await _record(store, job_id)).status is JobStatus.COMPLETED


@pytest.mark.redis
async def test_job_past_its_deadline_is_never_run(
    engine: AsyncEngine, client: aioredis.Redis, store: QueueStore, streams: TokenStreams
) -> None:
    now = _now_ms()
    late = await _admit(store, B, 8, enqueue_ms=now - 5_000, deadline_ms=now - 1_000)
    on_time = await _admit(store, B, 8, enqueue_ms=now - 4_000, deadline_ms=now + 60_000)
    dispatcher = Dispatcher(store, streams, engine, _config(), redis=client)

    await dispatcher.run_until_idle()

    record = await _record(store, late)
    assert record.status is JobStatus.EXPIRED
    assert record.attempts == 0
    events = await _events(streams, late)
    assert [(e.kind, e.data["status"], e.data["code"]) for e in events] == [
        (ERROR, 429, "deadline_expired")
    ]
    assert (await _record(store, on_time)).status is JobStatus.COMPLETED
    assert dispatcher.counters.count(K.EXPIRED, B) == 1
    assert dispatcher.counters.count(K.CLAIMED, B) == 1


@pytest.mark.redis
async def test_engine_validation_error_fails_the_job_with_400(
    engine: AsyncEngine, client: aioredis.Redis, store: QueueStore, streams: TokenStreams
) -> None:
    # Longer than the tiny model's context: admission would refuse it, the engine must too.
    job_id = await _admit(store, INT, 8, prompt=_prompt(1, 1100))
    dispatcher = Dispatcher(store, streams, engine, _config(), redis=client)

    await dispatcher.run_until_idle()

    record = await _record(store, job_id)
    assert record.status is JobStatus.FAILED
    assert record.error_json is not None
    assert json.loads(record.error_json)["code"] == "context_length_exceeded"
    events = await _events(streams, job_id)
    assert [(e.kind, e.data["status"]) for e in events] == [(ERROR, 400)]
    assert dispatcher.counters.count(K.FAILED, INT) == 1


# ---- cancellation --------------------------------------------------------------------------


@pytest.mark.redis
async def test_cancel_of_a_running_job_aborts_it_by_pubsub_not_the_lease_loop(
    engine: AsyncEngine, client: aioredis.Redis, store: QueueStore, streams: TokenStreams
) -> None:
    job_id = await _admit(store, INT, 900)
    # The lease loop's first round runs at start, before the cancel, and its next one only
    # after 10 minutes, far past the generous wait below: a cancel that ends the job within the
    # wait came by pub/sub, not by the flag check. (Before: "within 1 s" of wall time, a
    # verdict that depended on how fast this CPU is.)
    config = _config(lease_ms=1_200_000, renew_interval_ms=600_000)
    dispatcher = Dispatcher(store, streams, engine, config, redis=client)
    await dispatcher.start()
    try:
        assert (await _first_event(streams, job_id)).kind == DELTA
        assert await store.cancel(job_id, TENANT, _now_ms()) == "cancelling"
        events = await _events(streams, job_id, timeout_s=60.0)
    finally:
        await dispatcher.stop(drain_timeout_s=5.0)

    assert (events[-1].kind, events[-1].data["code"]) == (ERROR, "cancelled")
    assert len(events) < 900
    assert (await _record(store, job_id)).status is JobStatus.CANCELLED
    assert await _all_blocks_free(engine)
    assert dispatcher.counters.count(K.CANCELLED, INT) == 1
    assert dispatcher.counters.count(K.COMPLETED) == 0


@pytest.mark.redis
async def test_cancel_that_raced_the_claim_is_seen_by_its_flag(
    engine: AsyncEngine,
    client: aioredis.Redis,
    keys: Keys,
    store: QueueStore,
    streams: TokenStreams,
) -> None:
    job_id = await _admit(store, B, 50)
    # What cancel.lua leaves when its PUBLISH went out before this replica held the job.
    await client.set(keys.cancel(job_id), "1", px=60_000)
    dispatcher = Dispatcher(store, streams, engine, _config(), redis=client)

    await dispatcher.run_until_idle()

    assert (await _record(store, job_id)).status is JobStatus.CANCELLED
    assert [e.kind for e in await _events(streams, job_id)] == [ERROR]
    assert await client.exists(keys.cancel(job_id)) == 0
    assert dispatcher.counters.count(K.CANCELLED, B) == 1


@pytest.mark.redis
async def test_cancel_whose_message_was_lost_is_found_by_the_lease_loop(
    engine: AsyncEngine,
    client: aioredis.Redis,
    keys: Keys,
    store: QueueStore,
    streams: TokenStreams,
) -> None:
    job_id = await _admit(store, B, 900)
    config = _config(lease_ms=60_000, renew_interval_ms=30_000)
    dispatcher = Dispatcher(store, streams, engine, config, redis=client)
    await dispatcher.start()
    try:
        assert (await _first_event(streams, job_id)).kind == DELTA
        # The flag without its PUBLISH: what a listener that was reconnecting would miss.
        await client.set(keys.cancel(job_id), "1", px=60_000)
        await dispatcher.renew_leases()
        events = await _events(streams, job_id, timeout_s=5.0)
    finally:
        await dispatcher.stop(drain_timeout_s=5.0)

    assert (events[-1].kind, events[-1].data["code"]) == (ERROR, "cancelled")
    assert (await _record(store, job_id)).status is JobStatus.CANCELLED
    assert await _all_blocks_free(engine)


# ---- leases --------------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("noticed_by", ["renew", "complete"])
async def test_lost_lease_is_never_completed_by_its_old_holder(
    engine: AsyncEngine,
    client: aioredis.Redis,
    keys: Keys,
    store: QueueStore,
    streams: TokenStreams,
    noticed_by: str,
) -> None:
    clock = FakeClock(_now_ms())
    lease_ms = 60_000
    # The lease loop's own rounds are far apart; the test drives renew_leases() itself.
    config = _config(interactive=1, bulk=1, lease_ms=lease_ms, renew_interval_ms=30_000)
    dispatcher = Dispatcher(store, streams, engine, config, redis=client, clock_ms=clock)
    job_id = await _admit(store, B, 600 if noticed_by == "renew" else 250, enqueue_ms=clock())
    await dispatcher.start()
    try:
        assert (await _first_event(streams, job_id)).kind == DELTA
        # This replica stalls past its lease; another one sweeps and takes the job.
        clock.advance(lease_ms + 1)
        assert (await store.reclaim(clock(), 100)).requeued_ids == (job_id,)
        other = await store.claim([B], clock(), lease_ms, "r2", OFFSETS_MS)
        assert other.claimed is not None and other.claimed.job.job_id == job_id
        if noticed_by == "renew":
            await dispatcher.renew_leases()
    finally:
        drained = await dispatcher.stop(drain_timeout_s=20.0)

    assert drained.handed_back == ()
    assert dispatcher.counters.count(K.LEASE_LOST, B) == 1
    assert dispatcher.counters.count(K.COMPLETED) == dispatcher.counters.count(K.FAILED) == 0
    assert set(await _kinds_so_far(client, keys, job_id)) == {DELTA}
    assert await _all_blocks_free(engine)
    # The new holder's complete is the only one that lands.
    token = other.claimed.lease_token
    result = json.dumps({"text": "by r2", "finish_reason": "length", "usage": {}, "timings": {}})
    assert await store.complete(job_id, token, JobStatus.COMPLETED, result, None, clock())
    record = await _record(store, job_id)
    assert (record.status, record.attempts, record.lease_token) == (JobStatus.COMPLETED, 2, token)
    assert record.result_json == result


@pytest.mark.redis
async def test_reclaim_ends_the_stream_of_a_dead_replicas_interactive_job(
    engine: AsyncEngine, client: aioredis.Redis, store: QueueStore, streams: TokenStreams
) -> None:
    clock = FakeClock(_now_ms())
    job_id = await _admit(store, INT, 8, enqueue_ms=clock())
    claimed = await store.claim([INT], clock(), 10_000, "dead-replica", OFFSETS_MS)
    assert claimed.claimed is not None
    await streams.publish(job_id, DELTA, {"text": "Hi", "token_ids": [72, 105]})
    assert await store.mark_tokens_sent(job_id)
    dispatcher = Dispatcher(store, streams, engine, _config(), redis=client, clock_ms=clock)

    clock.advance(10_001)
    swept = await dispatcher.reclaim_lapsed()

    assert swept.failed_ids == (job_id,)
    events = await _events(streams, job_id)
    assert [e.kind for e in events] == [DELTA, ERROR]
    assert (events[-1].data["status"], events[-1].data["code"]) == (
        503,
        "lease_lost_after_first_token",
    )
    assert (await _record(store, job_id)).status is JobStatus.FAILED
    assert dispatcher.counters.count(K.FAILED, INT) == 1


# ---- replicas and drain ----------------------------------------------------------------------


@pytest.mark.redis
async def test_two_dispatchers_complete_each_job_exactly_once(
    engine: AsyncEngine,
    tiny_model_dir: Path,
    client: aioredis.Redis,
    store: QueueStore,
    streams: TokenStreams,
) -> None:
    job_ids = [await _admit(store, INT if i % 3 else B, 4 + i % 5) for i in range(30)]
    second_engine = _make_engine(tiny_model_dir)
    await second_engine.start()
    try:
        dispatchers = [
            Dispatcher(store, streams, eng, _config(replica_id=name), redis=client)
            for name, eng in (("r1", engine), ("r2", second_engine))
        ]
        await asyncio.gather(*(d.run_until_idle() for d in dispatchers))
    finally:
        await second_engine.stop()

    for job_id in job_ids:
        record = await _record(store, job_id)
        assert (record.status, record.attempts) == (JobStatus.COMPLETED, 1)
        assert [e.kind for e in await _events(streams, job_id)].count(END) == 1
    assert sum(d.counters.count(K.CLAIMED) for d in dispatchers) == 30
    assert sum(d.counters.count(K.COMPLETED) for d in dispatchers) == 30


@pytest.mark.redis
async def test_bulk_is_claimed_only_as_fast_as_the_engine_starts_it(
    engine: AsyncEngine,
    tiny_model_dir: Path,
    client: aioredis.Redis,
    store: QueueStore,
    streams: TokenStreams,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replica whose engine has not started its bulk jobs (no token yet) claims no more bulk
    past `max_unstarted_bulk_jobs`, though it has slots: the backlog stays in Redis, where a
    replica that can start it takes it."""
    job_ids = [await _admit(store, B, 4) for _ in range(6)]
    go = threading.Event()
    real_step = engine.engine.step

    def held_step() -> list[RequestOutput]:
        go.wait()  # this replica's engine takes no step until the test lets it
        return real_step()

    monkeypatch.setattr(engine.engine, "step", held_step)
    paced = _config(bulk=8, max_unstarted_bulk_jobs=2)
    held_claimed_two = asyncio.Event()
    held: Dispatcher

    def on_held_event(event: DispatchEvent) -> None:
        if event.kind is K.CLAIMED and held.counters.count(K.CLAIMED) == 2:
            held_claimed_two.set()

    held = Dispatcher(store, streams, engine, paced, redis=client, on_event=on_held_event)
    second_engine = _make_engine(tiny_model_dir)
    await second_engine.start()
    try:
        await held.start()
        async with asyncio.timeout(20.0):
            await held_claimed_two.wait()
        # A bulk job admitted on the held replica is queued, not started there.
        late = _new_job(B, 4)
        assert not (await held.admit_here(late)).started
        job_ids.append(late.job_id)

        unstarted_at_claims: list[int] = []
        other: Dispatcher

        def on_other_event(event: DispatchEvent) -> None:
            if event.kind is K.CLAIMED:
                unstarted_at_claims.append(other.unstarted_bulk())

        other_config = dataclasses.replace(paced, replica_id="r2")
        other = Dispatcher(
            store, streams, second_engine, other_config, redis=client, on_event=on_other_event
        )
        await other.run_until_idle()

        # The held replica still has its two and took nothing more; the other ran the rest,
        # never more than two of them waiting for their first token.
        assert (held.counters.count(K.CLAIMED), held.unstarted_bulk()) == (2, 2)
        assert other.counters.count(K.COMPLETED, B) == 5
        assert len(unstarted_at_claims) == 5 and max(unstarted_at_claims) <= 2
        go.set()
        drained = await held.stop(drain_timeout_s=30.0)
        assert (drained.finished, drained.handed_back) == (2, ())
    finally:
        go.set()
        await second_engine.stop()
    for job_id in job_ids:
        record = await _record(store, job_id)
        assert (record.status, record.attempts) == (JobStatus.COMPLETED, 1)


@pytest.mark.redis
async def test_stop_waits_for_jobs_that_finish_within_the_drain_timeout(
    engine: AsyncEngine,
    client: aioredis.Redis,
    store: QueueStore,
    streams: TokenStreams,
    hold_steps: StepHold,
) -> None:
    job_ids = [await _admit(store, cls, 40) for cls in (INT, B, B)]
    release = hold_steps(3)
    dispatcher = Dispatcher(store, streams, engine, _config(), redis=client)
    await dispatcher.start()
    for job_id in job_ids:
        assert (await _first_event(streams, job_id)).kind == DELTA
    # The engine steps on only once stop() has ended claiming: this callback runs just before
    # stop() resumes and counts its local jobs, and a job can end only on later turns of the
    # loop. (Before: free-running, a 40-token job could end before stop() counted it, which a
    # CI run hit: finished 2, not 3.)
    claim_task = dispatcher._claim_task  # noqa: SLF001
    assert claim_task is not None
    claim_task.add_done_callback(lambda _: release())

    drained = await dispatcher.stop(drain_timeout_s=20.0)

    assert (drained.finished, drained.handed_back, drained.not_handed_back) == (3, (), ())
    for job_id in job_ids:
        assert (await _record(store, job_id)).status is JobStatus.COMPLETED
    assert dispatcher.counters.count(K.COMPLETED) == 3


@pytest.mark.redis
async def test_stop_hands_back_jobs_still_running_at_the_timeout(
    engine: AsyncEngine,
    client: aioredis.Redis,
    store: QueueStore,
    streams: TokenStreams,
    hold_steps: StepHold,
) -> None:
    bulk_ids = [await _admit(store, B, 600) for _ in range(2)]
    chat_id = await _admit(store, INT, 600)
    hold_steps(3)
    dispatcher = Dispatcher(store, streams, engine, _config(), redis=client)
    await dispatcher.start()
    for job_id in [*bulk_ids, chat_id]:
        assert (await _first_event(streams, job_id)).kind == DELTA

    # Every job is still running when the (zero) drain timeout ends: the engine steps no further
    # once all three have their first token, until the hand-back aborts them. (Before: 600
    # tokens and a race, lost on a loaded CI machine, between the engine thread and this loop.)
    drained = await dispatcher.stop(drain_timeout_s=0.0)

    assert sorted(drained.handed_back) == sorted([*bulk_ids, chat_id])
    assert (drained.finished, drained.not_handed_back) == (0, ())
    assert await _all_blocks_free(engine)
    for job_id in bulk_ids:
        assert (await _record(store, job_id)).status is JobStatus.QUEUED
    # A chat stream that already showed tokens is not replayed: it ends with a clear error.
    chat_events = await _events(streams, chat_id)
    assert (chat_events[-1].kind, chat_events[-1].data["code"]) == (
        ERROR,
        "lease_lost_after_first_token",
    )
    assert dispatcher.counters.count(K.REQUEUED, B) == 2
    assert dispatcher.counters.count(K.COMPLETED) == 0

    successor = Dispatcher(store, streams, engine, _config(replica_id="r2"), redis=client)
    await successor.run_until_idle()

    for job_id in bulk_ids:
        record = await _record(store, job_id)
        assert (record.status, record.attempts, record.replica) == (JobStatus.COMPLETED, 2, "r2")
        assert [e.kind for e in await _events(streams, job_id)].count(END) == 1
    assert (await _record(store, chat_id)).status is JobStatus.FAILED
    assert successor.counters.count(K.COMPLETED) == 2


# ---- pieces --------------------------------------------------------------------------------


async def test_retry_transient_retries_connection_errors_only() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RedisConnectionError("connection reset")
        return "ok"

    backoff = Backoff(initial_ms=1, max_ms=2)
    assert await retry_transient(flaky, what="test", backoff=backoff) == "ok"
    assert len(calls) == 3

    calls.clear()
    with pytest.raises(RedisConnectionError):
        await retry_transient(flaky, what="test", backoff=backoff, max_attempts=2)
    assert len(calls) == 2

    async def broken() -> str:
        calls.append(1)
        raise ResponseError("WRONGTYPE")

    calls.clear()
    with pytest.raises(ResponseError):
        await retry_transient(broken, what="test", backoff=backoff)
    assert len(calls) == 1


def test_config_for_engine_puts_interactive_slots_on_top_of_bulk() -> None:
    config = DispatcherConfig.for_engine(
        "r1", max_active_seqs=16, interactive_reserved_seqs=4, lease_ms=9_000
    )
    assert dict(config.max_active_by_class) == {INT: 20, B: 16}
    assert (config.renew_interval_ms, config.reclaim_interval_ms) == (3_000, 4_500)
    assert dict(config.class_offsets_ms) == {INT: 0, B: 30_000}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"replica_id": ""},
        {"max_active_by_class": {INT: 1}},
        {"max_active_by_class": {INT: 0, B: 0}},
        {"max_active_by_class": {INT: -1, B: 2}},
        {"class_offsets_ms": {INT: 0}},
        {"lease_ms": 10_000, "renew_interval_ms": 6_000},
        {"renew_interval_ms": 0},
        {"reclaim_interval_ms": 0},
        {"wait_timeout_s": 0.0},
        {"retry_initial_backoff_ms": 5_000, "retry_max_backoff_ms": 100},
        {"max_unstarted_bulk_jobs": 0},
    ],
)
def test_config_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"replica_id": "r1", "max_active_by_class": {INT: 2, B: 1}}
    fields.update(kwargs)
    with pytest.raises(ValueError):
        DispatcherConfig(**fields)


def test_config_for_engine_rejects_a_reserve_as_large_as_the_bulk_slots() -> None:
    with pytest.raises(ValueError):
        DispatcherConfig.for_engine("r1", max_active_seqs=4, interactive_reserved_seqs=4)
