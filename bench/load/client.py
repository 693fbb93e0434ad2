"""The load generator's HTTP client: one aiohttp session, every request sent at once.

NOTE: why aiohttp and not httpx. The load generator shares the measured machine's two cores with
the server, so whatever CPU it spends per request is taken from the engine under test, in the
very second a burst arrives. httpx cost ~1.6 ms of CPU per request here (py-spy of the bench
process in `bench breakdown --workload mixed` on the 2-vCPU AMD EPYC: 48% of its samples in
`AsyncClient.request`, 13% in httpcore's pool walk, `has_expired` and `get_extra_info` on every
pooled connection per request, encode/httpx#3215); the bench process then held 0.35-0.77 of a
core for the first second of the run while the 400 job submissions went out and vLLM's steps got
0.5-0.9 of a core instead of 1.5-1.9. Earlier, one httpx pool of 400 connections stalled the
loop for seconds (the pool pass is quadratic), which this module used to work around with
shards of 32. aiohttp, the client of vLLM's own serving benchmark, keeps idle connections per
host in a list and parses responses in C (its `_http_parser`), and no shards are needed.

A request never waits for a pooled connection (the load stays open-loop): the connector has no
limit. Bodies go out as orjson bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDictProxy

__all__ = [
    "LOAD_ERRORS",
    "LoadClient",
    "LoadResponse",
    "LoadStream",
    "client_timeout",
    "warm_up",
]

# What a failed request raises (refused, reset, timed out): a sender records it as an error.
LOAD_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)
_JSON_HEADERS = {"Content-Type": "application/json"}


def client_timeout(connect_s: float, read_s: float) -> aiohttp.ClientTimeout:
    """No bound on a whole request (a stream may sit in a queue; the run's drain bounds it),
    `connect_s` to connect and `read_s` between two reads."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect_s, sock_read=read_s)


class LoadResponse:
    """A whole response: its status, headers and body."""

    def __init__(self, status_code: int, headers: CIMultiDictProxy[str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


class LoadStream:
    """A response whose body is read as it arrives (a chat's SSE stream)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.headers = response.headers

    async def aread(self) -> bytes:
        return await self._response.read()

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body's lines without their line ends, empty lines included."""
        async for raw in self._response.content:
            yield raw.decode("utf-8").rstrip("\r\n")


class LoadClient:
    """`get`/`post`/`delete` (whole responses) and `stream` on one base URL."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._session = aiohttp.ClientSession(
            headers=dict(headers or {}),
            timeout=timeout,
            # No connection limit: a request must never queue for a connection.
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
            # The servers measured here answer plain JSON; no cookies to keep.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self.in_flight = 0

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> LoadResponse:
        kwargs = self._kwargs(json, params, headers)
        if timeout_s is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        self.in_flight += 1
        try:
            async with self._session.request(method, self._base_url + url, **kwargs) as response:
                content = await response.read()
                return LoadResponse(response.status, response.headers, content)
        finally:
            self.in_flight -= 1

    async def get(self, url: str, **kwargs: Any) -> LoadResponse:
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> LoadResponse:
        return await self.request("POST", url, **kwargs)

    async def delete(self, url: str, **kwargs: Any) -> LoadResponse:
        return await self.request("DELETE", url, **kwargs)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[LoadStream]:
        """The response as it arrives; leaving the block early closes the connection (the
        server sees the client go)."""
        self.in_flight += 1
        try:
            async with self._session.request(
                method, self._base_url + url, **self._kwargs(json, None, headers)
            ) as response:
                yield LoadStream(response)
        finally:
            self.in_flight -= 1

    @staticmethod
    def _kwargs(
        json: Any, params: Mapping[str, str | int] | None, headers: Mapping[str, str] | None
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if json is not None:
            kwargs["data"] = orjson.dumps(json)
            kwargs["headers"] = {**_JSON_HEADERS, **(headers or {})}
        elif headers:
            kwargs["headers"] = dict(headers)
        if params:
            kwargs["params"] = {key: str(value) for key, value in params.items()}
        return kwargs

    async def aclose(self) -> None:
        await self._session.close()

    async def __aenter__(self) -> LoadClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def warm_up(client: LoadClient) -> None:
    """One unmeasured request before the schedule starts: the client's first-call set-up
    (lazy imports, the connector's first connection) is not paid by the first measured
    request. Every server the benches drive answers `GET /v1/models` (mixgate and vLLM alike),
    and a failure here is left to the measured requests to report.

    NOTE: without it, the first chat of each `bench compare` phase (sent from the chat process)
    took 39 ms longer at the client than the server's own TTFT for it (mixed phase) and 21 ms
    (chat alone), where the median chat's difference was 4 ms: that one chat was the
    chat-over-backlog phase's p99 in most repeats, for every policy alike. The keep-alive
    connection it leaves goes to exactly one request of a burst (aiohttp takes a pooled
    connection out of the pool when it hands it over); the others open their own.
    """
    with contextlib.suppress(*LOAD_ERRORS):
        await client.get("/v1/models")
