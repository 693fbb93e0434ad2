"""TTFT through `mixgate serve` against TTFT of an in-process AsyncEngine, for
`mixgate bench gateway`.

The two run one after the other (the server is stopped before the engine loads), never side by
side, so they share no CPU but see different noise.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

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


def gateway_ttft_ms(server_url: str, chats: int) -> list[float]:
    """TTFT of each chat through a running `mixgate serve`; chats with no content are left out."""
    with httpx.Client(base_url=server_url, timeout=60.0) as client:
        model = served_model(client)
        out: list[float] = []
        for index, messages in enumerate(prompts(WARMUP_CHATS) + prompts(chats)):
            ttft = _one_chat_ttft_ms(client, chat_body(model, messages, MAX_TOKENS))
            if index >= WARMUP_CHATS and ttft is not None:
                out.append(ttft)
        return out


def streamed_chat(server_url: str, max_tokens: int) -> None:
    """One streamed chat of `max_tokens` tokens, read to [DONE]."""
    with httpx.Client(base_url=server_url, timeout=60.0) as client:
        body = chat_body(served_model(client), prompts(1)[0], max_tokens)
        _one_chat_ttft_ms(client, body)


async def engine_ttft_ms(model_dir: Path, chats: int) -> list[float]:
    """TTFT of the same chats through an in-process AsyncEngine (same template, one thread)."""
    config = EngineConfig(num_threads=1, device="cpu", kv_cache_bytes=KV_CACHE_BYTES)
    llm = LLMEngine(model_dir, config)
    engine = AsyncEngine(llm)
    await engine.start()
    sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    out: list[float] = []
    try:
        for index, messages in enumerate(prompts(WARMUP_CHATS) + prompts(chats)):
            start = time.perf_counter()
            prompt = tuple(llm.tokenizer.encode_chat(messages))
            request = GenerationRequest(f"direct-{index}", prompt, sampling)
            ttft: float | None = None
            async for delta in engine.generate(request):
                # First visible text, as on the SSE side: the random model's bytes are often
                # held back until they form UTF-8, which delays text on both paths alike.
                if ttft is None and delta.new_text:
                    ttft = (time.perf_counter() - start) * 1000
            if index >= WARMUP_CHATS and ttft is not None:
                out.append(ttft)
    finally:
        await engine.stop()
    return out
