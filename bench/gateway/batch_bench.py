"""`mixgate bench batch`: does a running Batch API batch hurt interactive chat?

One `mixgate serve` child (a preset model made in a temp folder, or --model), a throwaway
redis-server. Streamed chats are timed on the client (TTFT: request sent -> first content
chunk; ITL: the gaps between content chunks) twice: on an idle server, then while a batch of
--lines lines runs. Each phase's p50/p99 is compared with the interactive targets of an SLO
file (default bench/slos/chat-over-backlog.toml). Prints a table, writes --json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.live.processes import ServerProcess, redis_url
from bench.report.summary import percentile

__all__ = ["run_batch_bench"]

URL = "/v1/chat/completions"


async def _one_chat(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, list[float]]:
    sent = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", URL, json=body) as response:
        response.raise_for_status()
        async for raw in response.aiter_lines():
            if not raw.startswith("data: ") or raw == "data: [DONE]":
                continue
            choices = json.loads(raw[len("data: ") :]).get("choices") or []
            if choices and choices[0]["delta"].get("content"):
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError("a chat produced no content")
    return stamps[0] - sent, [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


async def _chats(
    url: str, model: str, args: argparse.Namespace, tag: str, batch_id: str | None = None
) -> dict[str, Any]:
    """`args.chats` chats; with a batch id, chats keep starting until the batch has ended."""
    ttfts: list[float] = []
    itls: list[float] = []
    started_chats = 0
    batch_running = batch_id is not None

    async def watch(client: httpx.AsyncClient) -> None:
        nonlocal batch_running
        while batch_running:
            status = (await client.get(f"/v1/batches/{batch_id}")).json()["status"]
            batch_running = status not in ("completed", "failed", "expired", "cancelled")
            await asyncio.sleep(0.1)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal started_chats
        while started_chats < args.chats or batch_running:
            i = started_chats
            started_chats += 1
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"{tag} chat {i}: tell me a story."}],
                "max_tokens": args.chat_max_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
            }
            ttft, gaps = await _one_chat(client, body)
            ttfts.append(ttft)
            itls.extend(gaps)

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        started = time.perf_counter()
        await asyncio.gather(watch(client), *(worker(client) for _ in range(args.concurrency)))
        elapsed_s = time.perf_counter() - started
    return {
        "chats": len(ttfts),
        "elapsed_s": elapsed_s,
        "ttft_s": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
        "itl_s": {"p50": percentile(itls, 50), "p99": percentile(itls, 99)},
    }


def _targets(slo_path: str) -> dict[str, float]:
    """The interactive p99 bounds of the SLO file: {"ttft_s": max, "itl_s": max}."""
    spec = tomllib.loads(Path(slo_path).read_text())
    return {
        t["metric"]: float(t["max"])
        for t in spec.get("target", [])
        if t.get("class") == "interactive" and t.get("percentile") == 99 and "max" in t
    }


def _submit_batch(oc: openai.OpenAI, model: str, args: argparse.Namespace) -> str:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": URL,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"batch line {i}: summarize {i}."}],
                "max_tokens": args.line_max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        for i in range(args.lines)
    ]
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    uploaded = oc.files.create(file=("bench.jsonl", data), purpose="batch")
    batch = oc.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def _measure(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="bench") as oc:
        model = oc.models.list().data[0].id
        warm = argparse.Namespace(**{**vars(args), "chats": 4})
        asyncio.run(_chats(server.url, model, warm, "warm-up"))
        idle = asyncio.run(_chats(server.url, model, args, "idle"))
        started = time.perf_counter()
        batch_id = _submit_batch(oc, model, args)
        while oc.batches.retrieve(batch_id).status == "validating":
            time.sleep(0.05)
        loaded = asyncio.run(_chats(server.url, model, args, "loaded", batch_id))
        batch_s = time.perf_counter() - started
        batch = oc.batches.retrieve(batch_id)
    counts = batch.request_counts
    return {
        "idle": idle,
        "with_batch": loaded,
        "batch": {
            "lines": args.lines,
            "line_max_tokens": args.line_max_tokens,
            "status": batch.status,
            "completed": counts.completed if counts else None,
            # Until the loaded chats ended (they run as long as the batch, at least).
            "seconds": batch_s,
        },
    }


def _print(result: dict[str, Any]) -> None:
    targets = result["targets_p99_s"]
    print(f"{'phase':<12}{'ttft p50':>10}{'ttft p99':>10}{'itl p50':>10}{'itl p99':>10}  verdict")
    for phase in ("idle", "with_batch"):
        row = result[phase]
        ttft, itl = row["ttft_s"], row["itl_s"]
        ok = ttft["p99"] <= targets.get("ttft_s", float("inf")) and itl["p99"] <= targets.get(
            "itl_s", float("inf")
        )
        print(
            f"{phase:<12}{ttft['p50']:>10.4f}{ttft['p99']:>10.4f}{itl['p50']:>10.4f}"
            f"{itl['p99']:>10.4f}  {'meets' if ok else 'MISSES'} {targets}"
        )
    batch = result["batch"]
    print(
        f"batch: {batch['lines']} lines x {batch['line_max_tokens']} tokens {batch['status']} in "
        f"<= {batch['seconds']:.1f} s; {result['with_batch']['chats']} chats ran alongside"
    )


def run_batch_bench(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="mixgate-batch-bench-") as tmp_name:
        tmp = Path(tmp_name)
        model = Path(args.model) if args.model else None
        if model is None:
            from engine.model.make_model import make_model

            model = make_model(tmp / "model", args.preset, seed=0)
        with redis_url(args.redis_url, tmp / "redis") as url:
            server = ServerProcess(
                model, url, "{batch-bench}:", tmp / "data",
                extra_env={"MIXGATE_NUM_THREADS": str(args.threads)},
            ).start()  # fmt: skip
            try:
                result = _measure(server, args)
            except Exception:
                print(server.logs())  # the temp folder and its server log go away on exit
                raise
            finally:
                server.stop()
    result["targets_p99_s"] = _targets(args.slo)
    result["config"] = {k: v for k, v in vars(args).items() if k != "handler"}
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0
