"""The load generator's HTTP client (aiohttp), against a real uvicorn server on loopback: no
request ever waits for a pooled connection (open loop), bodies and parameters arrive as sent,
streams come line by line, and what fails in transport raises one of `LOAD_ERRORS`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.live.processes import free_port
from bench.load.client import LOAD_ERRORS, LoadClient, client_timeout, warm_up

TIMEOUT = client_timeout(connect_s=10.0, read_s=10.0)
# More than aiohttp's default connection limit (100): the client must lift it.
HELD = 150
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


class HoldingServer:
    """Answers /hold only once `HELD` requests are inside it at the same time."""

    def __init__(self) -> None:
        self.inside = 0
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()
        # (path, its `i` query parameter or -1) of every /v1/models and /ping request, in
        # arrival order.
        self.seen: list[tuple[str, int]] = []

    async def hold(self, request: Request) -> Response:
        self.inside += 1
        if self.inside == HELD:
            self.all_in.set()
        await self.release.wait()
        return JSONResponse({"inside": self.inside})

    async def ping(self, request: Request) -> Response:
        self.seen.append((request.url.path, int(request.query_params.get("i", -1))))
        return JSONResponse({"ok": True})

    async def echo(self, request: Request) -> Response:
        return JSONResponse(
            {
                "method": request.method,
                "body": orjson.loads(await request.body()) if request.method == "POST" else None,
                "content_type": request.headers.get("content-type"),
                "who": request.headers.get("x-who"),
                "auth": request.headers.get("authorization"),
                "query": dict(request.query_params),
            },
            status_code=429 if request.query_params.get("busy") else 200,
            headers={"Retry-After": "3"},
        )

    async def stream(self, request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"data: {i}\r\n\r\n".encode()

        return StreamingResponse(body(), media_type="text/event-stream")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/hold", self.hold),
                Route("/ping", self.ping, methods=["GET", "POST", "DELETE"]),
                Route("/v1/models", self.ping),
                Route("/echo", self.echo, methods=["GET", "POST", "DELETE"]),
                Route("/stream", self.stream, methods=["POST"]),
            ]
        )


@pytest.fixture
async def served() -> AsyncIterator[tuple[HoldingServer, str]]:
    holding = HoldingServer()
    port = free_port()
    config = uvicorn.Config(
        holding.app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield holding, f"http://127.0.0.1:{port}"
    finally:
        holding.release.set()
        server.should_exit = True
        await task


async def test_requests_never_wait_for_a_connection(served: tuple[HoldingServer, str]) -> None:
    holding, url = served
    async with LoadClient(url, timeout=TIMEOUT) as client:
        held = [asyncio.ensure_future(client.get("/hold")) for _ in range(HELD)]
        # The server answers nothing until all of them are inside it: a request queued for a
        # pooled connection would never get there (and this would time out).
        await asyncio.wait_for(holding.all_in.wait(), 30.0)
        assert client.in_flight == HELD
        holding.release.set()
        answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [200] * HELD
        assert client.in_flight == 0


async def test_bodies_parameters_and_headers_arrive_as_sent(
    served: tuple[HoldingServer, str],
) -> None:
    _, url = served
    async with LoadClient(url, headers={"Authorization": "Bearer k"}, timeout=TIMEOUT) as client:
        posted = await client.post(
            "/echo", json={"n": 1, "s": "é"}, params={"limit": 100}, headers={"x-who": "me"}
        )
        assert posted.status_code == 200
        assert posted.json() == {
            "method": "POST",
            "body": {"n": 1, "s": "é"},
            "content_type": "application/json",
            "who": "me",
            "auth": "Bearer k",
            "query": {"limit": "100"},
        }
        deleted = await client.delete("/echo")
        assert deleted.json()["method"] == "DELETE"
        assert deleted.json()["content_type"] is None
        refused = await client.get("/echo", params={"busy": "1"})
        # A refusal is an answer, not an error: its status and headers (any case) are read.
        assert refused.status_code == 429
        assert refused.headers.get("retry-after") == "3"
        assert orjson.loads(refused.text)["query"] == {"busy": "1"}


async def test_a_stream_comes_line_by_line_and_counts_while_open(
    served: tuple[HoldingServer, str],
) -> None:
    _, url = served
    async with LoadClient(url, timeout=TIMEOUT) as client:
        async with client.stream("POST", "/stream", json={}) as response:
            assert response.status_code == 200
            assert client.in_flight == 1
            lines = [line async for line in response.aiter_lines()]
        # Line ends (CRLF here) are cut; the blank lines between events stay.
        assert lines == ["data: 0", "", "data: 1", "", "data: 2", ""]
        assert client.in_flight == 0
        with pytest.raises(RuntimeError, match="left"):
            async with client.stream("POST", "/stream"):
                raise RuntimeError("left the block early")
        assert client.in_flight == 0
    with pytest.raises(RuntimeError, match="closed"):
        await client.get("/ping")


async def test_a_burst_after_the_warm_up_reaches_the_server_in_the_order_sent(
    served: tuple[HoldingServer, str],
) -> None:
    # The warm-up's keep-alive connection goes to one request of the burst, the others open
    # their own: none of them waits behind another's response.
    holding, url = served
    async with LoadClient(url, timeout=TIMEOUT) as client:
        await warm_up(client)
        # The ids travel in the path's query: the server records them in arrival order.
        await asyncio.gather(*(client.post("/ping", params={"i": i}) for i in range(100)))
    assert holding.seen[0][0] == "/v1/models"
    arrived = [i for path, i in holding.seen[1:]]
    assert sorted(arrived) == list(range(100))
    first_ranks = [arrived.index(i) for i in range(32)]
    assert max(first_ranks) < 48, first_ranks


async def test_a_read_that_outlasts_its_timeout_fails_as_a_load_error(
    served: tuple[HoldingServer, str],
) -> None:
    _, url = served
    async with LoadClient(url, timeout=client_timeout(connect_s=10.0, read_s=0.2)) as client:
        with pytest.raises(LOAD_ERRORS):
            await client.get("/hold")  # held until the fixture ends


async def test_a_warm_up_that_finds_no_server_leaves_it_to_the_measured_requests() -> None:
    async with LoadClient(f"http://127.0.0.1:{free_port()}", timeout=TIMEOUT) as client:
        await warm_up(client)  # connection refused: swallowed, nothing measured yet
        with pytest.raises(LOAD_ERRORS):
            await client.get("/ping")
