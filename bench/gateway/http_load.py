"""Job submissions/s and job status polls/s through HTTP against a live `mixgate serve`, for
`mixgate bench gateway`.

NOTE: the client is a minimal HTTP/1.1 keep-alive client on asyncio rather than httpx: on a
2-vCPU machine the client shares the cores with the server, and httpx spends several hundred
microseconds of CPU per request, so it would measure itself rather than the server. This one
sends requests built before the clock starts and reads each answer by its Content-Length (every
mixgate JSON answer has one), a few tens of microseconds per request. It is a load generator
for mixgate's own JSON routes, not a general HTTP client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

__all__ = ["HttpPhase", "KeepAliveConnection", "job_bodies", "poll_jobs", "submit_jobs"]

_CONTENT_LENGTH = b"\r\ncontent-length:"


@dataclass(slots=True)
class HttpPhase:
    """One timed phase: how many requests of each status, in how long."""

    requests: int
    elapsed_s: float
    statuses: Counter[int] = field(default_factory=Counter)
    # The job id of each accepted submission (empty for polls).
    job_ids: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        """Successful requests per second (2xx only: a fast 429 is not throughput)."""
        ok = sum(n for status, n in self.statuses.items() if 200 <= status < 300)
        return ok / self.elapsed_s if self.elapsed_s > 0 else 0.0


class KeepAliveConnection:
    """One persistent HTTP/1.1 connection; one request in flight at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> KeepAliveConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        """Send one prebuilt request; its status and body."""
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        start = head.lower().find(_CONTENT_LENGTH)
        if start < 0:
            raise RuntimeError(f"answer without Content-Length: {head[:200]!r}")
        start += len(_CONTENT_LENGTH)
        length = int(head[start : head.index(b"\r\n", start)])
        return status, await self._reader.readexactly(length)

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


def _request(method: str, host: str, path: str, body: bytes | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"host: {host}"]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    return head + (body or b"")


def job_bodies(model: str, count: int, max_tokens: int = 16, start: int = 0) -> list[bytes]:
    """Distinct job bodies of about a chat's size (each prompt differs, so none is cached);
    numbered from `start`, so that later rounds post other prompts."""
    return [
        orjson.dumps(
            {
                "model": model,
                "messages": [{"role": "user", "content": f"Job {i}: lighthouse {i}, its history."}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
        )
        for i in range(start, start + count)
    ]


async def _run(url: str, requests: Sequence[bytes], connections: int, keep_ids: bool) -> HttpPhase:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    conns = [await KeepAliveConnection.open(host, port) for _ in range(connections)]
    phase = HttpPhase(requests=len(requests), elapsed_s=0.0)
    ids: dict[int, str] = {}
    next_index = iter(range(len(requests)))

    async def worker(conn: KeepAliveConnection) -> None:
        for index in next_index:
            status, body = await conn.request(requests[index])
            phase.statuses[status] += 1
            if keep_ids and status == 202:
                ids[index] = orjson.loads(body)["id"]

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in conns))
        phase.elapsed_s = time.perf_counter() - start
    finally:
        for conn in conns:
            await conn.close()
    phase.job_ids = [ids[i] for i in sorted(ids)]
    return phase


async def submit_jobs(url: str, bodies: Sequence[bytes], connections: int) -> HttpPhase:
    """POST each body to /v1/jobs from `connections` keep-alive connections at once."""
    host = urlsplit(url).netloc
    requests = [_request("POST", host, "/v1/jobs", body) for body in bodies]
    return await _run(url, requests, connections, keep_ids=True)


async def poll_jobs(url: str, job_ids: Sequence[str], polls: int, connections: int) -> HttpPhase:
    """`polls` GET /v1/jobs/{id}, cycling over `job_ids`, from `connections` connections."""
    if not job_ids:
        raise ValueError("no job ids to poll")
    host = urlsplit(url).netloc
    requests = [
        _request("GET", host, f"/v1/jobs/{job_ids[i % len(job_ids)]}") for i in range(polls)
    ]
    return await _run(url, requests, connections, keep_ids=False)
