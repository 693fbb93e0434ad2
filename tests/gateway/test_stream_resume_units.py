"""Resumable streams in parts: the grace timer of an abandoned stream, the event ids a resume
reads from, and who may ask for a resumable stream.

Real redis-server (the queue's own scripts), and the timer's sleep injected: the test says
when the grace is over, so nothing waits on a clock. The end-to-end tests, with real servers,
are in tests/gateway/test_stream_resume.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from engine.core.sampling_params import SamplingParams
from gateway.dispatch.local_delivery import Listener
from gateway.dispatch.resume_grace import expire_abandoned
from gateway.dispatch.stream_event import DELTA, END, StreamEvent, local_event_id, parse_event_id
from gateway.http.errors import APIError
from gateway.http.schemas import parse_chat_request
from gateway.http.schemas_completions import parse_completion_request
from gateway.queue import Keys, NewJob, QueueStore
from gateway.queue.payload import JobPayload
from policies.request_class import RequestClass

pytestmark = [pytest.mark.anyio]


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _running_job(store: QueueStore, tenant: str = "t1") -> str:
    """A chat job started under a lease (running), as `start.lua` leaves it."""
    job_id = f"chatcmpl-{time.monotonic_ns()}"
    payload = JobPayload(
        prompt_token_ids=(1, 2, 3),
        sampling=SamplingParams(max_tokens=8),
        model="tiny",
        created_s=0,
        stream=True,
    )
    job = NewJob(
        job_id=job_id,
        tenant=tenant,
        request_class=RequestClass.INTERACTIVE,
        request_json=payload.to_json(),
        enqueue_ms=_now_ms(),
        cost_tokens=payload.cost_tokens,
        queue_limit=100,
    )
    assert await store.start(job, _now_ms(), 60_000, "r1") is not None
    return job_id


class GateSleep:
    """A sleep that returns when the test opens the gate (the grace is then over)."""

    def __init__(self) -> None:
        self.asked_s: list[float] = []
        self.gate = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.asked_s.append(seconds)
        await self.gate.wait()


@pytest.mark.redis
async def test_no_resume_within_the_grace_cancels_the_job(
    aclient: aioredis.Redis, keys: Keys
) -> None:
    store = QueueStore(aclient, keys)
    job_id = await _running_job(store)
    sleep = GateSleep()
    timer = asyncio.create_task(
        expire_abandoned(store, job_id, "t1", 0, 30.0, _now_ms, sleep=sleep)
    )
    await asyncio.sleep(0)  # the timer is waiting in its sleep now
    assert not timer.done() and sleep.asked_s == [30.0]
    assert await aclient.exists(keys.cancel(job_id)) == 0  # nothing before the grace is over
    sleep.gate.set()
    assert await timer == "cancelling"  # it runs: flagged, and its dispatcher aborts it
    assert await aclient.exists(keys.cancel(job_id)) == 1


@pytest.mark.redis
async def test_a_resume_within_the_grace_keeps_the_job_running(
    aclient: aioredis.Redis, keys: Keys
) -> None:
    store = QueueStore(aclient, keys)
    job_id = await _running_job(store)
    sleep = GateSleep()
    timer = asyncio.create_task(
        expire_abandoned(store, job_id, "t1", 0, 30.0, _now_ms, sleep=sleep)
    )
    await asyncio.sleep(0)
    # A client resumes (on any replica: the epoch is in Redis) before the grace is over.
    assert await store.resume_reader(job_id, "t1") == 1
    sleep.gate.set()
    assert await timer == "resumed"
    assert await aclient.hget(keys.job(job_id), "status") == "running"
    assert await aclient.exists(keys.cancel(job_id)) == 0
    # The resumed reader leaves too: its own timer, with its epoch, does cancel.
    assert await expire_abandoned(store, job_id, "t1", 1, 0.0, _now_ms) == "cancelling"


@pytest.mark.redis
async def test_resume_reader_never_touches_another_tenants_or_an_unknown_job(
    aclient: aioredis.Redis, keys: Keys
) -> None:
    store = QueueStore(aclient, keys)
    job_id = await _running_job(store, tenant="owner")
    assert await store.resume_reader(job_id, "intruder") is None
    assert await aclient.hget(keys.job(job_id), "reader_epoch") is None
    assert await store.resume_reader("chatcmpl-none", "owner") is None
    assert await aclient.exists(keys.job("chatcmpl-none")) == 0
    # A plain cancel (no epoch) is what it always was.
    assert await store.cancel(job_id, "owner", _now_ms()) == "cancelling"


def test_event_ids_are_redis_stream_ids_and_local_ones_sort_first() -> None:
    assert local_event_id(1) == "0-1"
    assert parse_event_id("0-7") == (0, 7)
    assert parse_event_id(" 1733050000000-3 ") == (1733050000000, 3)
    assert parse_event_id(local_event_id(10**6)) < parse_event_id("1-0")  # type: ignore[operator]
    for bad in ("", "7", "a-b", "1-2-3", "-1-0", "1-", "0x1-0", "1" * 21 + "-0", f"{1 << 64}-0"):
        assert parse_event_id(bad) is None, bad


def test_only_a_streamed_chat_may_ask_for_a_resumable_stream() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    options = {"stream_options": {"resumable": True}}
    parsed = parse_chat_request({**chat, **options})
    assert parsed.stream_options is not None and parsed.stream_options.resumable is True
    # Not without a stream (as OpenAI's other stream options), and not on legacy completions,
    # which have no resume route: a field that would do nothing is a 400, not ignored.
    refused = (
        lambda: parse_chat_request({**chat, "stream": False, **options}),
        lambda: parse_completion_request({"model": "m", "prompt": "hi", "stream": True, **options}),
    )
    for parse in refused:
        with pytest.raises(APIError) as caught:
            parse()
        assert caught.value.status == 400


class NoReads:
    """A listener's stream reader that must not be used (these listeners never read Redis)."""

    async def read_once(self, request_id: str, after: str, block_ms: int) -> list[StreamEvent]:
        raise AssertionError("no Redis read expected")


def test_a_resumable_listener_numbers_its_events_and_hands_them_over_once() -> None:
    running = Listener("j1", NoReads(), 100, resumable=True)
    running.attach(7)
    sent = [running.deliver_new(DELTA, {"text": t, "token_ids": [i]}) for i, t in enumerate("ab")]
    assert [e.entry_id for e in sent] == ["0-1", "0-2"]
    # Its attempt still runs: the attempt hands the stream over, not the handler.
    assert running.abandon() == [] and running.abandoned
    assert running.handover() == (sent, 3)

    ended = Listener("j2", NoReads(), 100, resumable=True)
    ended.attach(8)
    events = [ended.deliver_new(DELTA, {"text": "a", "token_ids": [1]})]
    events.append(ended.deliver_new(END, {"finish_reason": "length", "usage": {}}))
    ended.detach(8)
    # The attempt is over and its last event may not have reached the client: the handler
    # that abandons the stream writes it all.
    assert ended.abandon() == events

    # A plain stream neither numbers nor keeps anything (its frames carry no ids).
    plain = Listener("j3", NoReads(), 100)
    plain.attach(9)
    assert plain.deliver_new(DELTA, {"text": "a", "token_ids": [1]}).entry_id == ""
    assert plain.handover() == ([], 1)
