"""What happens to a generation whose resumable stream lost its client: it runs on for a grace
time (`stream_resume_grace_s`), and is cancelled then unless some client resumed the stream.

"Resumed" is the job's reader epoch in Redis (`QueueStore.resume_reader` bumps it; any
replica may serve the resume), and the timer's cancel is conditional on the epoch it saw
(`cancel.lua`), so a timer on one replica never cancels a stream that a client reads again on
another. A reader that leaves a resumed stream starts a timer of its own, with its epoch.

The timer lives on the replica whose handler lost the client. NOTE: when that replica stops
first, its timers go with it and the generation runs to its own end (bounded by max_tokens);
its outcome and stream stay readable for `stream_ttl_s`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import anyio
import structlog

from gateway.queue import QueueStore

log = structlog.get_logger("mixgate.resume")

# Pending timers, kept from GC (the handler that started one has returned).
_TIMERS: set[asyncio.Task[None]] = set()


async def expire_abandoned(
    store: QueueStore,
    job_id: str,
    tenant: str,
    reader_epoch: int,
    grace_s: float,
    clock_ms: Callable[[], int],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> str:
    """Wait out the grace, then cancel the job unless it was resumed; the cancel's outcome."""
    if grace_s > 0:
        await sleep(grace_s)
    # Shielded: a handler's cancelled scope (its client left) must not stop the cancel.
    with anyio.CancelScope(shield=True):
        outcome = await store.cancel(job_id, tenant, clock_ms(), reader_epoch=reader_epoch)
    log.info("stream_abandoned", job_id=job_id, epoch=reader_epoch, outcome=outcome)
    return outcome


def start_grace(
    store: QueueStore,
    job_id: str,
    tenant: str,
    reader_epoch: int,
    grace_s: float,
    clock_ms: Callable[[], int],
) -> asyncio.Task[None]:
    """The grace timer of one abandoned stream, as a task of its own."""

    async def run() -> None:
        try:
            await expire_abandoned(store, job_id, tenant, reader_epoch, grace_s, clock_ms)
        except Exception:  # noqa: BLE001 - a failed cancel leaves the job to its own end
            log.warning("abandoned_cancel_failed", job_id=job_id, exc_info=True)

    task = asyncio.create_task(run(), name=f"resume-grace-{job_id}")
    _TIMERS.add(task)
    task.add_done_callback(_TIMERS.discard)
    return task


def pending_timers() -> int:
    return len(_TIMERS)
