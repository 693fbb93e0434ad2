"""Cancel tasks and wait for them, bounded: the shutdown never waits on a task that will not end.

A task can swallow its cancel: a library that turns `CancelledError` into its own error, which
a retry loop then catches (redis-py has had such races in blocking reads and in its connection
timeouts: redis/redis-py#2028, #2551), ends only when its retry gives up, or never. An
unbounded `gather` after `cancel()` then hangs the whole shutdown, and `mixgate serve` ignores
its SIGTERM until an orchestrator's SIGKILL. Such a task is cancelled again, a few times, then
left behind with a warning: the process is exiting, and its leases lapse and are reclaimed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import structlog

__all__ = ["cancel_and_wait"]

log = structlog.get_logger("mixgate.app")


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], rounds: int = 3, grace_s: float = 1.0
) -> list[asyncio.Task[Any]]:
    """Cancel every unfinished task and wait up to `grace_s` for them, `rounds` times; returns
    the tasks left running (logged). Finished tasks' results and errors are consumed."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    for _ in range(rounds):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=grace_s)
    for task in pending:
        log.warning("background_task_ignored_cancel", task=task.get_name())
    await asyncio.gather(*(t for t in tasks if t.done()), return_exceptions=True)
    return [t for t in tasks if t in pending]
