"""Hearing cancellations of running jobs: the pub/sub channel, and the flags behind it.

`QueueStore.cancel` on a running job sets `cancel:{id}` and then publishes the id. Pub/sub is
at-most-once, so the flag is the source of truth and the message only makes it fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import redis.asyncio as aioredis
import structlog
from redis.asyncio.client import PubSub

from gateway.dispatch.retry import TRANSIENT_ERRORS, Backoff
from gateway.queue import Keys
from gateway.queue.redis_text import redis_text
from gateway.runtime.bounded_cancel import cancel_and_wait

log = structlog.get_logger("mixgate.dispatcher")

# How long start() waits for the server to confirm the subscription.
_SUBSCRIBE_CONFIRM_TIMEOUT_S = 5.0


async def cancel_flags_set(redis: aioredis.Redis, keys: Keys, job_ids: Sequence[str]) -> list[bool]:
    """Whether each job's cancel flag is set, read in one round trip."""
    if not job_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.exists(keys.cancel(job_id))
        replies = await pipe.execute()
    return [bool(n) for n in replies]


class CancelListener:
    """Calls `on_cancel(job_id)` for every id published on the cancel channel."""

    def __init__(
        self,
        redis: aioredis.Redis,
        channel: str,
        on_cancel: Callable[[str], object],
        backoff: Backoff,
    ) -> None:
        self._redis = redis
        self._channel = channel
        self._on_cancel = on_cancel
        self._backoff = backoff
        self._pubsub: PubSub | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._pubsub is not None:
            raise RuntimeError("the cancel listener is already started")
        pubsub = self._redis.pubsub()
        try:
            await pubsub.subscribe(self._channel)
            # The confirmation comes first: once it is read, a cancel published after start()
            # returns is heard.
            if await pubsub.get_message(timeout=_SUBSCRIBE_CONFIRM_TIMEOUT_S) is None:
                log.warning("cancel_subscribe_unconfirmed", channel=self._channel)
        except BaseException:
            await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
            raise
        self._pubsub = pubsub
        self._task = asyncio.create_task(self._listen(pubsub), name="cancel-listener")

    async def stop(self) -> None:
        if self._task is not None:
            # Bounded: a pubsub read that swallows its cancel must not hold the shutdown.
            await cancel_and_wait([self._task])
            self._task = None
        if self._pubsub is not None:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]
            self._pubsub = None

    async def _listen(self, pubsub: PubSub) -> None:
        delays = self._backoff.delays_s()
        while True:
            try:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
            except TRANSIENT_ERRORS as error:
                # redis-py subscribes again when it reconnects; messages sent in between are
                # lost, which the flag check of the lease loop covers.
                log.warning("cancel_listener_error", error=repr(error))
                await asyncio.sleep(next(delays))
                continue
            delays = self._backoff.delays_s()
            if message is not None and redis_text(message.get("type")) == "message":
                self._on_cancel(redis_text(message["data"]))
