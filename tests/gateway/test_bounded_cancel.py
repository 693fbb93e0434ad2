"""cancel_and_wait ends however its tasks take their cancels; the dispatcher's stop uses it.

A task that swallows every cancel (as redis-py's blocking reads have, in races) must not hold a
shutdown: before, `Dispatcher.stop`'s last wait gathered its job tasks without a bound.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.runtime.bounded_cancel import cancel_and_wait

pytestmark = pytest.mark.anyio


async def _swallows_cancels(stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await stop.wait()
        except asyncio.CancelledError:
            continue  # the library's retry loop: the cancel is gone


async def _ends_on_cancel() -> None:
    await asyncio.Event().wait()


async def _ends_by_itself() -> str:
    return "done"


async def test_a_task_that_swallows_its_cancels_is_left_behind_not_awaited_forever() -> None:
    stop = asyncio.Event()
    stubborn = asyncio.create_task(_swallows_cancels(stop), name="stubborn")
    polite = asyncio.create_task(_ends_on_cancel(), name="polite")
    finished = asyncio.create_task(_ends_by_itself(), name="finished")
    await asyncio.sleep(0)  # every task reaches its first await
    left = await asyncio.wait_for(cancel_and_wait([stubborn, polite, finished], grace_s=0.05), 5)
    assert left == [stubborn]
    assert polite.cancelled() and finished.result() == "done"
    assert not stubborn.done()
    stop.set()  # let it end, so the test leaves no task behind
    await stubborn


async def test_nothing_to_cancel_returns_at_once() -> None:
    assert await asyncio.wait_for(cancel_and_wait([]), 1) == []
