"""One newest-first page over several tenants' listings (the console's admin view).

Each tenant's jobs and batches are a ZSET scored by creation time (ms). A page across tenants
is their merge in (score, id) order, newest first; its cursor is ``"<score>:<id>"`` of the
page's last item, valid in every tenant's listing (an id cursor is not: it names one tenant's
member). Members of one score come back in reverse lexicographic order, as ZREVRANGEBYSCORE
returns them, so the merge order is total and a page never repeats nor skips an item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from gateway.http.errors import APIError
from gateway.queue.redis_text import redis_text

__all__ = ["Cursor", "ListedId", "merged_page", "parse_cursor"]


@dataclass(frozen=True, slots=True, order=True)
class Cursor:
    score_ms: int
    item_id: str

    def encode(self) -> str:
        return f"{self.score_ms}:{self.item_id}"


@dataclass(frozen=True, slots=True)
class ListedId:
    item_id: str
    score_ms: int
    # Which listing it came from (a tenant), as the caller named it.
    source: str

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.score_ms, self.item_id)


def parse_cursor(raw: str | None) -> Cursor | None:
    if not raw:
        return None
    score, sep, item_id = raw.partition(":")
    if not sep or not score.isdigit() or not item_id:
        raise APIError.invalid_request("after must be a cursor from a previous page", param="after")
    return Cursor(int(score), item_id)


async def _one_listing(
    redis: Redis, key: str, source: str, want: int, before: Cursor | None
) -> list[ListedId]:
    found: list[ListedId] = []
    offset = 0
    maximum: str | int = "+inf" if before is None else before.score_ms
    while len(found) < want:
        rows: Sequence[Any] = await redis.zrevrangebyscore(
            key, maximum, "-inf", start=offset, num=want, withscores=True
        )
        if not rows:
            break
        offset += len(rows)
        for member, score in rows:
            item = ListedId(redis_text(member), int(score), source)
            # At the cursor's own score only the members after it (reverse lexicographic).
            if before is None or item.cursor < before:
                found.append(item)
        if len(rows) < want:
            break
    return found[:want]


async def merged_page(
    redis: Redis, listings: Sequence[tuple[str, str]], limit: int, before: Cursor | None
) -> tuple[list[ListedId], bool]:
    """Up to `limit` ids, newest first, over `listings` ((ZSET key, source) pairs), after
    `before`; and whether more follow."""
    merged: list[ListedId] = []
    for key, source in listings:
        merged += await _one_listing(redis, key, source, limit + 1, before)
    merged.sort(key=lambda item: item.cursor, reverse=True)
    return merged[:limit], len(merged) > limit
