"""Wake-up markers: how an idle claim loop learns that work of a class was queued.

admit and reclaim add one member per job to `wake:{class}` (`Keys.wake`); an idle claim loop
blocks on BZPOPMIN over the keys of the classes it has room for, and Redis hands each member to
one blocked client, the longest-blocked first. A claim that leaves a class's queue empty deletes
the class's markers (`claim.lua`): they announced work that is gone, and each would cost an
idle replica one claim that finds nothing.

A member popped by a replica that has no room for its class any more (its wait was issued
while it had room; a BZPOPMIN cannot be withdrawn without dropping its connection) is passed
on: added back, so that Redis hands it to another replica blocked on that key, or keeps it for
the next replica that waits with room.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.queue.keys import Keys
from gateway.queue.redis_text import redis_text
from policies.request_class import RequestClass

__all__ = ["WakeUp", "WakeUps"]


@dataclass(frozen=True, slots=True)
class WakeUp:
    """One popped marker: enough to pass it on unchanged."""

    request_class: RequestClass
    member: str
    score: float


class WakeUps:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._class_of_key = {keys.wake(c): c for c in RequestClass}

    async def wait(self, classes: Collection[RequestClass], timeout_s: float) -> WakeUp | None:
        """Block until admit or reclaim signals work of one of `classes`; None on timeout."""
        # BZPOPMIN reads 0 as "forever": an idle loop must still come back to reclaim leases.
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not classes:
            raise ValueError("a wait for work needs at least one class")
        wake_keys = [self._keys.wake(c) for c in RequestClass if c in classes]
        reply = await self._redis.bzpopmin(wake_keys, timeout=timeout_s)
        if reply is None:
            return None
        key, member, score = reply
        return WakeUp(self._class_of_key[redis_text(key)], redis_text(member), float(score))

    async def pass_on(self, wake_up: WakeUp) -> None:
        """Put a popped marker back for another waiter of its class. NOTE: no trim: one
        member over the bound until the next admit of the class trims it."""
        await self._redis.zadd(
            self._keys.wake(wake_up.request_class), {wake_up.member: wake_up.score}
        )
