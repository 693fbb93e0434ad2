"""When to send what: the open-loop schedule, closed-loop clients, the sampler and the drain.

No HTTP here: requests go through an injected `send` coroutine and time through an injected
clock and sleep, so tests run the whole schedule on a virtual clock without sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any

from bench.load.workload import ClosedLoopSource, PlannedRequest, Workload, plan_open_loop
from policies.request_class import RequestClass

__all__ = ["LoadDriver", "Send", "sample_loop"]

# Sends one request and returns when it has ended; the result is how long a closed-loop client
# should pause before its next request (a rejection's Retry-After), 0.0 otherwise.
Send = Callable[[PlannedRequest], Coroutine[Any, Any, float]]


class LoadDriver:
    """Runs a workload's schedule against `send`, all times relative to `t0` on `clock`.

    `classes`: only these classes' requests (None: all). Each class keeps exactly the requests
    (indexes, times, sizes) it has in the whole workload, so the classes can be driven from
    separate processes on one shared t0 and still make the one seeded load.
    """

    def __init__(
        self,
        workload: Workload,
        send: Send,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        t0: float,
        classes: Iterable[RequestClass] | None = None,
    ) -> None:
        self.workload = workload
        self.classes = frozenset(workload.classes if classes is None else classes)
        self._send = send
        self._clock = clock
        self._sleep = sleep
        self.t0 = t0
        self.plan = [req for req in plan_open_loop(workload) if req.request_class in self.classes]
        # Every request handed to `send` (open- and closed-loop), in send order.
        self.issued: list[PlannedRequest] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    def now_s(self) -> float:
        return self._clock() - self.t0

    async def sleep_until(self, at_s: float) -> None:
        delay_s = at_s - self.now_s()
        if delay_s > 0:
            await self._sleep(delay_s)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_loop(self) -> None:
        for request in self.plan:
            await self.sleep_until(request.at_s)
            self.issued.append(request)
            # Open loop: never wait for an answer before the next send.
            self._spawn(self._send(request))

    async def _closed_client(self, source: ClosedLoopSource) -> None:
        while (now_s := self.now_s()) < self.workload.duration_s:
            request = source.next_request(now_s)
            self.issued.append(request)
            pause_s = await self._send(request)
            if pause_s > 0:
                await self._sleep(pause_s)

    async def run_schedule(self) -> None:
        """Send everything the workload plans; returns at duration_s, once the last open-loop
        request is sent (requests and closed-loop clients may still be in flight: drain)."""
        for cls, load in self.workload.classes.items():
            if load.arrival.kind == "closed" and cls in self.classes:
                # One source per class: the clients share its deterministic sequence.
                source = ClosedLoopSource(self.workload, cls)
                for _ in range(load.arrival.concurrency):
                    # Tracked like a request, so the drain waits for (or cancels) its last one.
                    self._spawn(self._closed_client(source))
        await self._open_loop()
        await self.sleep_until(self.workload.duration_s)

    async def drain(self, drain_s: float) -> int:
        """Wait up to `drain_s` for in-flight requests, then cancel the rest (returns how many
        were cancelled; the caller records them as incomplete)."""

        async def wait_drain() -> None:
            await self._sleep(drain_s)

        timer = asyncio.get_running_loop().create_task(wait_drain())
        try:
            while self._tasks and not timer.done():
                await asyncio.wait({*self._tasks, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        left = list(self._tasks)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        return len(left)


async def sample_loop(
    scrape: Callable[[float], Awaitable[None]],
    *,
    interval_s: float,
    now_s: Callable[[], float],
    sleep_until: Callable[[float], Awaitable[None]],
) -> None:
    """Scrape at 0, interval, 2*interval, ... (run-relative) until cancelled. Ticks are on a
    fixed grid rather than `interval` after the last scrape, so slow scrapes do not drift."""
    tick = 0
    while True:
        await scrape(now_s())
        tick += 1
        # A scrape slower than the interval skips the ticks it overran instead of bunching up.
        tick = max(tick, int(now_s() / interval_s) + 1)
        await sleep_until(tick * interval_s)
