"""TTFT through `mixgate serve` against TTFT of an in-process AsyncEngine, for
`mixgate bench gateway`.

The two take turns chat by chat (`paired_ttft_ms`): the server's chat, then the same prompt on
the direct engine, never at once, so they share no CPU and see the same noise. (Run one after
the other, the server stopped before the engine loaded, two runs' p99 of gateway-added TTFT
differed by 0.5 ms: a tail of 200 chats taken minutes apart from the tail it is compared with.)
The server is timed twice: with a raw HTTP/1.1 client on one keep-alive socket (`RawSseClient`:
what the gateway adds, with the least client work in the way) and with httpx (what a Python
client sees, its own request building and SSE parsing included).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson

from bench.live.processes import ServerProcess
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from engine.process.async_engine import AsyncEngine

MAX_TOKENS = 4
KV_CACHE_BYTES = 64 << 20
# Requests sent before timing (both sides): first calls touch cold code paths.
WARMUP_CHATS = 3


def prompts(count: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Question {i}: tell me about lighthouse number {i}."}]
        for i in range(count)
    ]


def _content_frames(lines: Iterator[str]) -> Iterator[str]:
    """The `content` of each SSE chunk, in order (the role chunk yields nothing)."""
    for line in lines:
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[len("data: ") :]).get("choices", []):
            content = choice.get("delta", {}).get("content")
            if content:
                yield content


def _one_chat_ttft_ms(client: httpx.Client, body: dict[str, Any]) -> float | None:
    start = time.perf_counter()
    ttft: float | None = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"chat failed: {response.status_code} {response.text}")
        for _ in _content_frames(response.iter_lines()):
            if ttft is None:
                ttft = (time.perf_counter() - start) * 1000
        # Drained to [DONE] so the next request starts on an idle server.
    return ttft


def chat_body(model: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }


def start_bench_server(
    model_dir: Path, redis_url: str, data_dir: Path, extra_env: dict[str, str] | None = None
) -> ServerProcess:
    """A fresh `mixgate serve` on its own key prefix, ready."""
    prefix = f"{{mg-bench-{uuid.uuid4().hex[:8]}}}:"
    env = {"MIXGATE_LOG_LEVEL": "warning", **(extra_env or {})}
    return ServerProcess(model_dir, redis_url, prefix, data_dir, extra_env=env).start()


def served_model(client: httpx.Client) -> str:
    return str(client.get("/v1/models").json()["data"][0]["id"])


def streamed_chat(server_url: str, max_tokens: int) -> None:
    """One streamed chat of `max_tokens` tokens, read to [DONE]."""
    with httpx.Client(base_url=server_url, timeout=60.0) as client:
        body = chat_body(served_model(client), prompts(1)[0], max_tokens)
        _one_chat_ttft_ms(client, body)


@dataclass(frozen=True, slots=True)
class PairedTtft:
    """TTFT in ms of the same chats, taken in turns: through the server with each client, and
    on the direct engine; entry i of each list is the same prompt."""

    gateway_raw_ms: list[float]
    gateway_httpx_ms: list[float]
    direct_ms: list[float]


async def paired_ttft_ms(server_url: str, model_dir: Path, chats: int) -> PairedTtft:
    """Each prompt through the server (raw client, then httpx), then on an in-process
    AsyncEngine on the same model folder (same template, one thread, as the server's engine).
    Chats with no content are left out."""
    config = EngineConfig(num_threads=1, device="cpu", kv_cache_bytes=KV_CACHE_BYTES)
    llm = LLMEngine(model_dir, config)
    engine = AsyncEngine(llm)
    await engine.start()
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    result = PairedTtft([], [], [])
    raw = RawSseClient(server_url)
    try:
        with httpx.Client(base_url=server_url, timeout=60.0) as client:
            model = served_model(client)
            for index, messages in enumerate(prompts(WARMUP_CHATS) + prompts(chats)):
                body = chat_body(model, messages, MAX_TOKENS)
                # NOTE: the two synchronous clients block this loop while they wait; the direct
                # engine is idle meanwhile, and its own turn comes after them.
                raw_ms = raw.chat_ttft_ms(body)
                httpx_ms = _one_chat_ttft_ms(client, body)
                direct_ms = await _direct_ttft_ms(engine, llm, messages, index, sampling)
                # Kept as triples (index i is one prompt on all three), so that per-chat
                # differences can be taken. Greedy on the same model: a chat whose text is
                # held back on one path is held back on the others too.
                if (
                    index >= WARMUP_CHATS
                    and raw_ms is not None
                    and httpx_ms is not None
                    and direct_ms is not None
                ):
                    result.gateway_raw_ms.append(raw_ms)
                    result.gateway_httpx_ms.append(httpx_ms)
                    result.direct_ms.append(direct_ms)
    finally:
        raw.close()
        await engine.stop()
    return result


async def _direct_ttft_ms(
    engine: AsyncEngine,
    llm: LLMEngine,
    messages: list[dict[str, str]],
    index: int,
    sampling: SamplingParams,
) -> float | None:
    start = time.perf_counter()
    prompt = tuple(llm.tokenizer.encode_chat(messages))
    request = GenerationRequest(f"direct-{index}", prompt, sampling)
    ttft: float | None = None
    async for delta in engine.generate(request):
        # First visible text, as on the SSE side: the random model's bytes are often held
        # back until they form UTF-8, which delays text on both paths alike.
        if ttft is None and delta.new_text:
            ttft = (time.perf_counter() - start) * 1000
    return ttft


class RawSseClient:
    """POST a streamed chat over one keep-alive socket and time its first content frame.

    Just enough HTTP/1.1 for uvicorn's answer to a streamed chat: a status line, headers, a
    chunked body of SSE frames. No pooling, no header objects, no per-line decoding: the time
    between sending the request and reading its first content frame is the server's, plus a
    loopback round trip.
    """

    def __init__(self, server_url: str) -> None:
        parts = urlsplit(server_url)
        self._host = parts.hostname or "127.0.0.1"
        self._sock = socket.create_connection((self._host, parts.port or 80))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def close(self) -> None:
        self._sock.close()

    def _fill(self) -> None:
        data = self._sock.recv(65536)
        if not data:
            raise RuntimeError("server closed the connection")
        self._buffer += data

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self._buffer:
            self._fill()
        head, _, self._buffer = self._buffer.partition(marker)
        return head

    def _read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            self._fill()
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def _chunks(self) -> Iterator[bytes]:
        """The chunked body's chunks, to the terminating empty one."""
        while True:
            size = int(self._read_until(b"\r\n").split(b";")[0], 16)
            if size == 0:
                self._read_until(b"\r\n")
                return
            yield self._read_exact(size)
            self._read_exact(2)

    def chat_ttft_ms(self, body: dict[str, Any]) -> float | None:
        payload = orjson.dumps(body)
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: "
            + self._host.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(payload)).encode()
            + b"\r\n\r\n"
            + payload
        )
        start = time.perf_counter()
        self._sock.sendall(request)
        status_and_headers = self._read_until(b"\r\n\r\n")
        if not status_and_headers.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"chat failed: {status_and_headers[:200]!r}")
        if b"chunked" not in status_and_headers.lower():
            raise RuntimeError("expected a chunked SSE body")
        ttft: float | None = None
        pending = b""
        for chunk in self._chunks():
            if ttft is not None:
                continue  # drained to the end so the next request starts on an idle server
            pending += chunk
            *frames, pending = pending.split(b"\n\n")
            for frame in frames:
                if not frame.startswith(b"data: {"):
                    continue
                choices = orjson.loads(frame[len(b"data: ") :]).get("choices", [])
                if any(choice.get("delta", {}).get("content") for choice in choices):
                    ttft = (time.perf_counter() - start) * 1000
                    break
        return ttft
