"""Idle claim loops across replicas (`ClaimWaits`) against a real redis-server: a chat's wake-up
reaches a replica that has room for it, not one whose chat slots are full.

Each "replica" is a `ClaimWaits` on its own client, as a dispatcher holds one; the tests play
the dispatcher's part (which classes have room). Order on the server is checked with
`INFO clients` (Redis hands a marker to the longest-blocked client), never with sleeps. Wait
timeouts are far past the tests' own bounds, so a wait can only end by a wake-up or a slot.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from gateway.dispatch.retry import Backoff
from gateway.dispatch.waits import ClaimWaits
from gateway.queue import Keys, NewJob, QueueStore
from policies.request_class import RequestClass

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

INT, B = RequestClass.INTERACTIVE, RequestClass.BULK
NEVER_S = 600.0


def _job(job_id: str, cls: RequestClass) -> NewJob:
    return NewJob(
        job_id=job_id,
        tenant="t1",
        request_class=cls,
        request_json="{}",
        enqueue_ms=1_700_000_000_000,
        cost_tokens=10,
        queue_limit=100,
    )


@pytest.fixture
async def clients(redis_server: str) -> AsyncIterator[list[aioredis.Redis]]:
    # No socket timeout (redis-py's default is 5 s): a BZPOPMIN here blocks for NEVER_S.
    made = [
        aioredis.from_url(redis_server, decode_responses=True, socket_timeout=None)
        for _ in range(3)
    ]
    try:
        yield made
    finally:
        for client in made:
            await client.aclose()


async def _until_blocked(client: aioredis.Redis, count: int) -> None:
    async with asyncio.timeout(30.0):
        while int((await client.info("clients"))["blocked_clients"]) < count:
            await asyncio.sleep(0.005)


async def _blocked(client: aioredis.Redis) -> int:
    return int((await client.info("clients"))["blocked_clients"])


def _waits(client: aioredis.Redis, keys: Keys, classes: tuple[RequestClass, ...]) -> ClaimWaits:
    return ClaimWaits(QueueStore(client, keys), classes, NEVER_S, Backoff())


async def _chat_slots_fill_while_waiting(
    waits: ClaimWaits, admin: aioredis.Redis, blocked: int
) -> asyncio.Task[None]:
    """An idle wait on both classes (one BZPOPMIN each, still blocked after it ends); then its
    chat slots fill up (a direct start) and the replica waits with bulk room only."""
    idle_wait = asyncio.create_task(waits.wait(work=(INT, B), slot=True))
    await _until_blocked(admin, blocked + 2)
    waits.slot_freed.set()  # the claim loop's turn: here, its chat slots fill up
    await idle_wait
    waits.slot_freed.clear()
    return asyncio.create_task(waits.wait(work=(B,), slot=True))


async def test_a_replica_full_of_chats_does_not_wait_for_chat_work(
    clients: list[aioredis.Redis], keys: Keys
) -> None:
    admin, first, second = clients
    admitter = QueueStore(admin, keys)
    base = await _blocked(admin)
    full = _waits(first, keys, (INT, B))  # its chat slots are taken: only bulk has room
    with_room = _waits(second, keys, (INT,))
    try:
        full_wait = asyncio.create_task(full.wait(work=(B,), slot=True))
        await _until_blocked(admin, base + 1)  # blocked first: Redis would serve it first
        room_wait = asyncio.create_task(with_room.wait(work=(INT,), slot=False))
        await _until_blocked(admin, base + 2)
        await admitter.admit(_job("c1", INT))
        async with asyncio.timeout(30.0):
            await room_wait
        assert not full_wait.done()
        # Its bulk wait still answers bulk work.
        await admitter.admit(_job("b1", B))
        async with asyncio.timeout(30.0):
            await full_wait
    finally:
        await full.close()
        await with_room.close()


async def test_a_wake_up_popped_after_the_slots_filled_is_passed_on(
    clients: list[aioredis.Redis], keys: Keys
) -> None:
    # A replica's chat wait began while it had room and is still blocked on the server when a
    # direct start fills its chat slots (a BZPOPMIN cannot be withdrawn without dropping its
    # connection). A chat queued then must still reach the replica that has room.
    admin, first, second = clients
    admitter = QueueStore(admin, keys)
    base = await _blocked(admin)
    filling = _waits(first, keys, (INT, B))
    with_room = _waits(second, keys, (INT,))
    try:
        full_wait = await _chat_slots_fill_while_waiting(filling, admin, base)
        room_wait = asyncio.create_task(with_room.wait(work=(INT,), slot=False))
        await _until_blocked(admin, base + 3)
        await admitter.admit(_job("c1", INT))
        async with asyncio.timeout(30.0):
            await room_wait
        assert not full_wait.done()
        # Passed on once, then taken: no marker is left to wake anyone again.
        assert await admin.zcard(keys.wake(INT)) == 0
        full_wait.cancel()
    finally:
        await filling.close()
        await with_room.close()


async def test_a_full_replica_keeps_a_wake_up_for_itself_when_no_one_else_waits(
    clients: list[aioredis.Redis], keys: Keys
) -> None:
    # Passed on with no other waiter, the marker stays, and the replica's own next wait with
    # room takes it (its slot-freed claim may have found the job already; one spare claim).
    admin, first, _ = clients
    admitter = QueueStore(admin, keys)
    base = await _blocked(admin)
    waits = _waits(first, keys, (INT, B))
    try:
        full_wait = await _chat_slots_fill_while_waiting(waits, admin, base)
        await admitter.admit(_job("c1", INT))
        async with asyncio.timeout(30.0):
            while await admin.zcard(keys.wake(INT)) == 0 or await _blocked(admin) > base + 1:
                await asyncio.sleep(0.005)
        assert not full_wait.done()
        waits.slot_freed.set()  # a chat ended: its claim loop claims, then waits with room
        await full_wait
        waits.slot_freed.clear()
        async with asyncio.timeout(30.0):
            await waits.wait(work=(INT, B), slot=True)
        assert await admin.zcard(keys.wake(INT)) == 0
    finally:
        await waits.close()
