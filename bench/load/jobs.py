"""One poller for every outstanding bulk job of a load run.

NOTE: a GET per job per poll would make a backlog of thousands of jobs flood the very server
being measured (hundreds of requests per second, on the same two cores). Paging the caller's
job list (newest first, 100 a page) costs a few requests per poll instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from bench.load.client import LOAD_ERRORS, LoadClient

PAGE_LIMIT = 100
Job = dict[str, Any]


class JobWatcher:
    def __init__(
        self, client: LoadClient, sleep: Callable[[float], Awaitable[None]], poll_s: float
    ) -> None:
        self._client = client
        self._sleep = sleep
        self._poll_s = poll_s
        self._waiters: dict[str, tuple[Callable[[Job], bool], asyncio.Future[Job]]] = {}
        self._task: asyncio.Task[None] | None = None

    async def wait(self, job_id: str, done: Callable[[Job], bool]) -> Job:
        """The job's body, once `done(body)` holds for it."""
        future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._waiters[job_id] = (done, future)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            return await future
        finally:
            self._waiters.pop(job_id, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._waiters:
            # A page per 100 outstanding jobs: poll a long list less often (at most ~4 pages
            # a second), so the poller's load on the server stays bounded.
            await self._sleep(max(self._poll_s, len(self._waiters) / (PAGE_LIMIT * 4)))
            with contextlib.suppress(*LOAD_ERRORS):
                await self._poll_once()

    async def _poll_once(self) -> None:
        remaining = set(self._waiters)
        after: str | None = None
        while remaining:
            params: dict[str, Any] = {"limit": PAGE_LIMIT}
            if after is not None:
                params["after"] = after
            response = await self._client.get("/v1/jobs", params=params)
            if response.status_code != 200:
                return
            # A page is up to 100 finished jobs with their results, every poll (orjson).
            page = response.json()
            for job in page["data"]:
                remaining.discard(job["id"])
                waiter = self._waiters.get(job["id"])
                if waiter is not None and not waiter[1].done() and waiter[0](job):
                    waiter[1].set_result(job)
            if not page["has_more"]:
                return
            after = page["last_id"]
