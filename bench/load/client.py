"""The load generator's HTTP client: many small httpx connection pools that act as one.

NOTE: one httpx pool with hundreds of connections stalls the load generator's own event loop.
httpcore walks every pooled connection (and, for each idle one, every connection again) on
each request's start and end (encode/httpx#3215; encode/httpcore#1035 is not merged): at 400
connections a burst of 400 job submissions blocked the loop for ~4 s and every later request
cost ~40 ms of loop time (helper's measurement against a trivial server). In `bench compare`'s
`mixed` run that stall was measured as chat TTFT (5.5 s) and delayed every chat planned in it.
Pools of at most `shard_requests` requests keep each pass short: 400 at once then took 0.66 s
and a later request 1.3 ms.

A request never waits for a pooled connection (the load stays open-loop): when every shard
has `shard_requests` in flight, a new shard is made.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import httpx

__all__ = ["SHARD_REQUESTS", "LoadClient", "ShardedClient", "warm_up"]

SHARD_REQUESTS = 32


class ShardedClient:
    """`get`/`post`/`delete`/`stream` of httpx.AsyncClient over shards of bounded size."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout,
        shard_requests: int = SHARD_REQUESTS,
    ) -> None:
        if shard_requests < 1:
            raise ValueError(f"shard_requests: must be >= 1, got {shard_requests!r}")
        self._base_url = base_url
        self._headers = dict(headers or {})
        self._timeout = timeout
        self._shard_requests = shard_requests
        # NOTE: one TLS context for every shard: an httpx client makes its own by default,
        # loading the CA bundle (~170 ms for the first, ~23 ms each after, helper's machine),
        # which a burst paid on its loop per new shard and the first chat paid in its TTFT.
        self._ssl = ssl.create_default_context()
        self._shards: list[httpx.AsyncClient] = []
        # Requests in flight per shard, in the order of `_shards`.
        self._busy: list[int] = []
        self._closed = False
        # The first shard now, before any measured request.
        self._add_shard()

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def in_flight(self) -> list[int]:
        """Requests in flight per shard (each at most `shard_requests`)."""
        return list(self._busy)

    def _lease(self) -> int:
        if self._closed:
            raise RuntimeError("the client is closed")
        # The first shard with room: warm keep-alive connections get reused first.
        for index, busy in enumerate(self._busy):
            if busy < self._shard_requests:
                self._busy[index] += 1
                return index
        index = self._add_shard()
        self._busy[index] = 1
        return index

    def _add_shard(self) -> int:
        self._shards.append(self.spare())
        self._busy.append(0)
        return len(self._shards) - 1

    def spare(self) -> httpx.AsyncClient:
        """A client configured as a shard, outside the pool (the caller closes it)."""
        return httpx.AsyncClient(
            base_url=self._base_url,
            headers=self._headers,
            timeout=self._timeout,
            verify=self._ssl,
            # No connection limit: the lease above bounds a shard's requests, and a request
            # must never queue for a connection.
            limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=self._shard_requests
            ),
        )

    async def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        index = self._lease()
        try:
            return await self._shards[index].request(method, url, **kwargs)
        finally:
            self._busy[index] -= 1

    async def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("POST", url, **kwargs)

    async def delete(self, url: str, **kwargs: Any) -> httpx.Response:
        return await self.request("DELETE", url, **kwargs)

    @asynccontextmanager
    async def stream(self, method: str, url: str, **kwargs: Any) -> AsyncIterator[httpx.Response]:
        index = self._lease()
        try:
            async with self._shards[index].stream(method, url, **kwargs) as response:
                yield response
        finally:
            self._busy[index] -= 1

    async def aclose(self) -> None:
        self._closed = True
        for shard in self._shards:
            await shard.aclose()

    async def __aenter__(self) -> ShardedClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


# What a sender talks through: the sharded client in a run, a plain httpx client where a
# caller brings its own.
LoadClient = ShardedClient | httpx.AsyncClient


async def warm_up(client: ShardedClient) -> None:
    """One unmeasured request before the schedule starts, through a spare client configured as
    the shards are: it runs httpx's request path once (its lazy imports and first-call set-up),
    so that the first measured request does not pay for it. Every server the benches drive
    answers `GET /v1/models` (mixgate and vLLM alike), and a failure here is left to the
    measured requests to report.

    NOTE: without it, the first chat of each `bench compare` phase (sent from the chat process)
    took 39 ms longer at the client than the server's own TTFT for it (mixed phase) and 21 ms
    (chat alone), where the median chat's difference was 4 ms: that one chat was the
    chat-over-backlog phase's p99 in most repeats, for every policy alike.

    NOTE: not through a shard: a pool that holds an idle keep-alive connection hands it to every
    request of a burst that enters before one of them has sent on it (httpcore assigns without
    reserving; pydantic/httpx2#1075 fixes it, encode/httpcore#1035 is not merged), and the
    losers retry after the burst. Warmed through the first shard, `mixed`'s 400 job submissions
    reached the server with that shard's other 31 last, at ~0.4 s instead of in the first 30
    ms: the 400-job intake then overlapped the chats sent at 0.42 s, in every policy's run. A
    shard with no connection opens one per request of a burst.
    """
    with contextlib.suppress(httpx.HTTPError):
        async with client.spare() as spare:
            await spare.get("/v1/models")
