"""Retrying Redis writes that must land (token events, job results) through transient errors."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import redis.exceptions
import structlog

log = structlog.get_logger("mixgate.dispatcher")

T = TypeVar("T")

# Errors after which the same call may succeed: the connection dropped or timed out, or the
# server is loading its AOF after a restart (BusyLoadingError is a ConnectionError).
# OSError covers socket errors that reach us unwrapped.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
)


@dataclass(frozen=True, slots=True)
class Backoff:
    initial_ms: int = 50
    max_ms: int = 2_000

    def __post_init__(self) -> None:
        if not 1 <= self.initial_ms <= self.max_ms:
            raise ValueError(
                f"need 1 <= initial_ms <= max_ms, got {self.initial_ms}, {self.max_ms}"
            )

    def delays_s(self) -> Iterator[float]:
        """Doubling delays up to max_ms, each with jitter, so replicas do not retry in step."""
        delay_ms = float(self.initial_ms)
        while True:
            yield random.uniform(0.5, 1.0) * delay_ms / 1000.0
            delay_ms = min(delay_ms * 2.0, float(self.max_ms))


async def retry_transient(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    max_attempts: int | None = None,
) -> T:
    """Run `op` until it returns, retrying transient Redis errors with backoff.

    NOTE: unbounded by default: a job's result must be written, and a caller that has to give
    up (stop) cancels the task instead. Other errors are raised at once.
    """
    if max_attempts is not None and max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    delays = backoff.delays_s()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await op()
        except TRANSIENT_ERRORS as error:
            if max_attempts is not None and attempt >= max_attempts:
                raise
            delay_s = next(delays)
            log.warning(
                "redis_retry",
                what=what,
                attempt=attempt,
                delay_s=round(delay_s, 3),
                error=repr(error),
            )
            await asyncio.sleep(delay_s)
