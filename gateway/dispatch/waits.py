"""What an idle claim loop blocks on: new work in Redis, a local slot freeing up, or stop.

Never a poll: new work is a wake-up key that admit and reclaim touch (a BZPOPMIN on the key of
each class this replica has room for: `gateway.queue.wake_ups`), a free slot is an
asyncio.Event that every ending job (and every bulk job's first token) sets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection

import structlog

from gateway.dispatch.retry import Backoff
from gateway.queue import QueueStore
from gateway.queue.wake_ups import WakeUp
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.dispatcher")


class ClaimWaits:
    def __init__(
        self,
        store: QueueStore,
        classes: Collection[RequestClass],
        wait_timeout_s: float,
        backoff: Backoff,
    ) -> None:
        self._wake_ups = store.wake_ups
        # The classes this replica claims at all.
        self._classes = frozenset(classes)
        self._wait_timeout_s = wait_timeout_s
        self._backoff = backoff
        # Set by every local job as it ends, and by a bulk job's first token (the claim
        # pacing's room: `DispatcherConfig.max_unstarted_bulk_jobs`). The claim loop clears it
        # before it counts slots, with no await in between, so neither is missed.
        self.slot_freed = asyncio.Event()
        self.stopping = asyncio.Event()
        # One BZPOPMIN per class, each on its own connection, started when the class has room.
        # NOTE: one outlives a wait that something else ended, and serves the next wait of its
        # class: cancelling it would drop its connection (redis-py cannot abandon a blocked
        # reply), and jobs end often. One whose class has since filled up passes on what it
        # pops (`_settle`), so that a replica with room gets the wake-up.
        self._wakes: dict[RequestClass, asyncio.Task[WakeUp | None]] = {}

    async def wait(self, *, work: Collection[RequestClass], slot: bool) -> None:
        """Return on stop, on new work of a class in `work` (those with room here), or on a
        freed slot (if `slot`)."""
        work = self._classes.intersection(work)
        for cls in work:
            if cls not in self._wakes:
                self._wakes[cls] = asyncio.create_task(
                    self._wake_ups.wait([cls], self._wait_timeout_s)
                )
        events = [asyncio.ensure_future(self.stopping.wait())]
        if slot:
            events.append(asyncio.ensure_future(self.slot_freed.wait()))
        try:
            while not any(event.done() for event in events):
                # Every pending BZPOPMIN is watched, not only those of `work`: one of a full
                # class must pass on what it pops at once, not when this wait ends.
                await asyncio.wait(
                    [*events, *self._wakes.values()], return_when=asyncio.FIRST_COMPLETED
                )
                if await self._settle(work):
                    return
        finally:
            for event in events:
                event.cancel()
            await asyncio.gather(*events, return_exceptions=True)

    async def _settle(self, work: frozenset[RequestClass]) -> bool:
        """Take in the finished BZPOPMINs; True when one of `work` ended (woken or timed
        out: either way the caller claims again)."""
        claim = False
        for cls, task in list(self._wakes.items()):
            if not task.done():
                continue
            del self._wakes[cls]
            error = None if task.cancelled() else task.exception()
            if error is not None:
                log.warning("wait_for_work_failed", error=repr(error))
                await self.sleep(next(self._backoff.delays_s()))
                return True
            wake_up = task.result()
            if cls in work:
                # A wake-up that landed while the caller was busy claiming costs one extra,
                # possibly empty, claim.
                claim = True
            elif wake_up is not None:
                try:
                    await self._wake_ups.pass_on(wake_up)
                except Exception as pass_error:  # noqa: BLE001 - the lease path still runs it
                    log.warning("wake_up_pass_on_failed", error=repr(pass_error))
        return claim

    async def sleep(self, delay_s: float) -> None:
        """A backoff that stop cuts short."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=delay_s)

    async def close(self) -> None:
        """Give up the pending BZPOPMINs (redis-py drops their connections on cancel)."""
        wakes = list(self._wakes.values())
        self._wakes.clear()
        for task in wakes:
            task.cancel()
        await asyncio.gather(*wakes, return_exceptions=True)
