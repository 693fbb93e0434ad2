"""Whether Redis answers, as one flag that request handlers read instead of finding out slowly.

The background watcher pings Redis every `redis_check_interval_s` (each ping bounded by a
timeout) and refreshes the queue depths admission reads; a request whose Redis call failed on
the connection flips the flag at once. While the flag is down, every route that needs Redis
answers 503 without touching it: a stopped or hung Redis costs a client milliseconds, not a
socket timeout per request. Work already on the engine keeps running; its writes are retried
(`gateway.dispatch.retry`) and land when Redis is back.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import redis.exceptions
import structlog

__all__ = [
    "HealthFlag",
    "RedisUnreachable",
    "is_connection_failure",
    "mark_unreachable",
    "require_redis",
    "watch",
]

log = structlog.get_logger("mixgate.redis_health")

# NOTE: BlockingConnectionPool raises ConnectionError with this text when every pooled
# connection stays busy past the pool timeout: Redis is fine then, this replica is just busy.
_POOL_EXHAUSTED = "No connection available"


class RedisUnreachable(redis.exceptions.RedisError):
    """Raised without calling Redis while the flag is down; rendered as a 503 like any
    RedisError (`gateway.http.errors`)."""


class HealthFlag(Protocol):
    """The part of the gateway state this module reads and writes."""

    redis_ok: bool


def is_connection_failure(error: BaseException) -> bool:
    """A failure to reach Redis (refused, reset, timed out), not a busy pool or a bad reply."""
    if isinstance(error, redis.exceptions.TimeoutError | OSError):
        return True
    if isinstance(error, redis.exceptions.ConnectionError):
        return _POOL_EXHAUSTED not in str(error)
    return False


def mark_unreachable(state: HealthFlag, error: BaseException) -> None:
    """Flip the flag down after a failed call; the watcher flips it up again."""
    if state.redis_ok and is_connection_failure(error):
        log.warning("redis_unreachable", seen_by="request", error=repr(error))
        state.redis_ok = False


def require_redis(state: HealthFlag) -> None:
    """Fail at once while Redis is known to be down (the handler answers 503 + Retry-After)."""
    if not state.redis_ok:
        raise RedisUnreachable("redis is marked unreachable")


class _Check(Protocol):
    async def __call__(self) -> None: ...


async def watch(
    state: HealthFlag,
    check: _Check,
    interval_s: float,
    timeout_s: float,
    failures_to_flip: int = 2,
) -> None:
    """Run `check` (a ping, plus whatever should be refreshed) every `interval_s`, forever.

    NOTE: the watcher flips the flag down only after `failures_to_flip` failed checks in a row:
    on a CPU-starved host one ping can miss its timeout while Redis is fine, and a false
    "down" refuses good requests. A Redis that is really gone is noticed sooner anyway, by the
    first request whose call fails on the connection (`mark_unreachable`).
    """
    failures = 0
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                await check()
            failures = 0
            if not state.redis_ok:
                log.info("redis_reachable")
            state.redis_ok = True
        except Exception as error:  # noqa: BLE001 - any failure means "not reachable" here
            if _cancel_requested():
                # NOTE: a cancel that lands inside a Redis call can come back as a connection
                # error (the client drops the connection); swallowing it here kept this loop
                # alive and hung the lifespan's shutdown on an idle server (1 run in ~10).
                raise asyncio.CancelledError from error
            failures += 1
            if state.redis_ok and failures >= failures_to_flip:
                log.warning("redis_unreachable", seen_by="watcher", error=repr(error))
                state.redis_ok = False
        await asyncio.sleep(interval_s)


def _cancel_requested() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
