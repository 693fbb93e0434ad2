"""The load generator's sharded HTTP client, against a real uvicorn server on loopback: no
request ever waits for a pooled connection (open loop), and no shard holds more than its
bound of requests in flight (what keeps httpcore's per-request pool pass short)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bench.live.processes import free_port
from bench.load.client import ShardedClient, warm_up

TIMEOUT = httpx.Timeout(10.0, pool=None)
HELD = 100
SHARD = 32


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

    async def stream(self, request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for i in range(3):
                yield f"data: {i}\n\n".encode()

        return StreamingResponse(body(), media_type="text/event-stream")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/hold", self.hold),
                Route("/ping", self.ping, methods=["GET", "POST", "DELETE"]),
                Route("/v1/models", self.ping),
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


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_requests_never_wait_for_a_connection(served: tuple[HoldingServer, str]) -> None:
    holding, url = served
    async with ShardedClient(url, timeout=TIMEOUT, shard_requests=SHARD) as client:
        held = [asyncio.ensure_future(client.get("/hold")) for _ in range(HELD)]
        # The server answers nothing until all of them are inside it: a request queued for a
        # pooled connection would never get there (and this would time out).
        await asyncio.wait_for(holding.all_in.wait(), 30.0)
        assert client.num_shards == math.ceil(HELD / SHARD)
        assert all(busy <= SHARD for busy in client.in_flight)
        assert sum(client.in_flight) == HELD
        holding.release.set()
        answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [200] * HELD
        assert client.in_flight == [0] * client.num_shards


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_sequential_requests_reuse_one_shard(served: tuple[HoldingServer, str]) -> None:
    _, url = served
    async with ShardedClient(url, timeout=TIMEOUT, shard_requests=SHARD) as client:
        for method in (client.get, client.post, client.delete):
            response = await method("/ping")
            assert response.json() == {"ok": True}
        assert client.num_shards == 1
        assert client.in_flight == [0]


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_stream_holds_its_lease_until_the_block_ends(
    served: tuple[HoldingServer, str],
) -> None:
    _, url = served
    async with ShardedClient(url, timeout=TIMEOUT, shard_requests=1) as client:
        async with client.stream("POST", "/stream") as response:
            assert client.in_flight == [1]
            # A second request while the stream is open needs a shard of its own (bound 1).
            assert (await client.get("/ping")).status_code == 200
            assert client.num_shards == 2
            lines = [line async for line in response.aiter_lines() if line]
        assert lines == ["data: 0", "data: 1", "data: 2"]
        assert client.in_flight == [0, 0]
        with pytest.raises(RuntimeError, match="left"):
            async with client.stream("POST", "/stream"):
                raise RuntimeError("left the block early")
        assert client.in_flight == [0, 0]
    with pytest.raises(RuntimeError, match="closed"):
        await client.get("/ping")


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_burst_after_the_warm_up_reaches_the_server_in_the_order_sent(
    served: tuple[HoldingServer, str],
) -> None:
    # httpcore hands a pool's idle keep-alive connection to every request of a burst; the
    # losers go last. Warmed through the first shard, its other 31 requests of 100 reached
    # the server 70th to 99th; warmed through a spare client, the shards hold no connection
    # and each request of the burst opens its own (the first 32 arrived first, 4 of 4 runs
    # with both cores busy).
    holding, url = served
    async with ShardedClient(url, timeout=TIMEOUT, shard_requests=SHARD) as client:
        await warm_up(client)
        # The ids travel in the path's query: the server records them in arrival order.
        await asyncio.gather(*(client.post("/ping", params={"i": i}) for i in range(100)))
    assert holding.seen[0][0] == "/v1/models"
    arrived = [i for path, i in holding.seen[1:]]
    assert sorted(arrived) == list(range(100))
    first_shard_ranks = [arrived.index(i) for i in range(SHARD)]
    assert max(first_shard_ranks) < 48, first_shard_ranks


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_warm_up_that_finds_no_server_leaves_it_to_the_measured_requests() -> None:
    async with ShardedClient(f"http://127.0.0.1:{free_port()}", timeout=TIMEOUT) as client:
        await warm_up(client)  # connection refused: swallowed, nothing measured yet
        with pytest.raises(httpx.ConnectError):
            await client.get("/ping")


def test_shard_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="shard_requests"):
        ShardedClient("http://127.0.0.1:1", timeout=TIMEOUT, shard_requests=0)
