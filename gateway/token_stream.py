"""Token delivery over a Redis Stream per request (`out:{id}`): the replica that runs a request
appends events; the HTTP handler on any replica reads them with XREAD BLOCK.

Events are stream entries with two fields: `e` (the kind) and `d` (JSON):
- `delta`: {"text": str, "token_ids": [int]}
- `end`:   {"finish_reason": str, "usage": {...}, "timings": {...}}   (the last event)
- `error`: {"status": int, "code": str, "message": str}              (the last event)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from gateway.redis_text import redis_text

DELTA, END, ERROR = "delta", "end", "error"


@dataclass(frozen=True, slots=True)
class StreamEvent:
    kind: str
    data: dict[str, Any]
    # The stream entry id (usable as an SSE `id:` for resuming).
    entry_id: str

    @property
    def is_last(self) -> bool:
        return self.kind in (END, ERROR)


class TokenStreams:
    def __init__(self, redis: aioredis.Redis, key_for: Any, ttl_s: int = 3600):
        # key_for(request_id) -> the stream key (gateway.queue.keys.Keys.out).
        self._redis = redis
        self._key_for = key_for
        self._ttl_s = ttl_s

    async def publish(self, request_id: str, kind: str, data: dict[str, Any]) -> str:
        """Append one event; the last event of a request also sets the stream's expiry."""
        key = self._key_for(request_id)
        fields = {"e": kind, "d": json.dumps(data, separators=(",", ":"))}
        if kind in (END, ERROR):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xadd(key, fields)  # type: ignore[arg-type]
                pipe.expire(key, self._ttl_s)
                entry_id, _ = await pipe.execute()
        else:
            entry_id = await self._redis.xadd(key, fields)  # type: ignore[arg-type]
        return redis_text(entry_id)

    async def read(
        self, request_id: str, after: str = "0-0", block_ms: int = 1000
    ) -> AsyncIterator[StreamEvent]:
        """Yield events after `after` until the last one; each wait is at most block_ms.

        Yields nothing for an empty wait only through the caller's own timeout: the loop
        keeps blocking, so callers wrap it in their deadline (and disconnect handling).
        """
        key = self._key_for(request_id)
        cursor = after
        while True:
            reply: Any = await self._redis.xread({key: cursor}, block=block_ms, count=256)
            # RESP2 answers [[key, entries]]; RESP3 answers {key: entries}.
            streams = reply.items() if isinstance(reply, dict) else (reply or [])
            for _, entries in streams:
                for entry_id, fields in entries:
                    cursor = redis_text(entry_id)
                    event = _event(cursor, fields)
                    yield event
                    if event.is_last:
                        return


def _event(entry_id: str, fields: dict[Any, Any]) -> StreamEvent:
    decoded = {redis_text(k): redis_text(v) for k, v in fields.items()}
    return StreamEvent(decoded["e"], json.loads(decoded["d"]), entry_id)
