"""What an idle claim loop blocks on: new work in Redis, a local slot freeing up, or stop.

Never a poll: new work is a wake-up key that admit and reclaim touch (BZPOPMIN on the keys of
the classes this replica claims), a free slot is an asyncio.Event that every ending job sets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection

import structlog

from gateway.dispatch.retry import Backoff
from gateway.queue import QueueStore
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
        self._store = store
        # The classes whose wake-ups end a wait: the ones this replica claims.
        self._classes = frozenset(classes)
        self._wait_timeout_s = wait_timeout_s
        self._backoff = backoff
        # Set by every local job as it ends. The claim loop clears it before it counts slots,
        # with no await in between, so an end after the count is never missed.
        self.slot_freed = asyncio.Event()
        self.stopping = asyncio.Event()
        # NOTE: the BZPOPMIN outlives a wait that a free slot ended, and serves the next wait:
        # cancelling it would drop its connection (redis-py cannot abandon a blocked reply),
        # and jobs end often.
        self._wake: asyncio.Task[bool] | None = None

    async def wait(self, *, work: bool, slot: bool) -> None:
        """Return on stop, on new work (if `work`), or on a freed slot (if `slot`)."""
        events = [asyncio.ensure_future(self.stopping.wait())]
        if slot:
            events.append(asyncio.ensure_future(self.slot_freed.wait()))
        if work and self._wake is None and self._classes:
            self._wake = asyncio.create_task(
                self._store.wait_for_work(self._classes, self._wait_timeout_s)
            )
        wake = self._wake if work else None
        try:
            await asyncio.wait(
                [*events, *([wake] if wake else [])], return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for event in events:
                event.cancel()
            await asyncio.gather(*events, return_exceptions=True)
        if wake is not None and wake.done():
            # Woken or timed out, either way the caller claims again. A wake-up that landed
            # while the caller was busy claiming costs one extra, empty claim.
            self._wake = None
            error = None if wake.cancelled() else wake.exception()
            if error is not None:
                log.warning("wait_for_work_failed", error=repr(error))
                await self.sleep(next(self._backoff.delays_s()))

    async def sleep(self, delay_s: float) -> None:
        """A backoff that stop cuts short."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=delay_s)

    async def close(self) -> None:
        """Give up the pending BZPOPMIN (redis-py drops its connection on cancel)."""
        if self._wake is not None:
            self._wake.cancel()
            await asyncio.gather(self._wake, return_exceptions=True)
            self._wake = None
