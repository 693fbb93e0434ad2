"""`mixgate bench soak --minutes N`: a bounded soak of a live `mixgate serve`.

It drives chat streams and bulk jobs for N minutes with the load generator, a fifth of them
cancelled (clients that leave mid-stream, jobs DELETEd while they run), samples the server's
RSS (the whole process tree: gateway, engine core, embedded redis) and /metrics on a grid, lets
the server settle, and judges: memory flat over the second half, every KV block free, the
engine idle, no more asyncio tasks than before the load, no lease lost (the dispatcher's
`lease_lost` events) and no request the server failed (5xx or a broken stream).
It prints a table and the verdict, writes JSON, and exits 1 when the verdict fails.

Without --url it starts its own redis-server and server (a model made with --preset unless
--model is given); with --url it targets a running server (RSS only with --pid).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.live.processes import ServerProcess, redis_url
from bench.load.generator import run_load
from bench.load.records import ERROR
from bench.load.workload_spec import Arrival, Cancellation, ClassLoad, LengthDist, Workload
from bench.soak.report import SoakSample, format_table, judge, sample_from_metrics
from policies.request_class import RequestClass

__all__ = ["run_soak", "soak_workload"]

_MIB = 1024 * 1024


# Request lengths (prompt tokens, output tokens) per class for each --shape. chat-over-backlog's
# are issue 13's load (bench/workloads/chat-over-backlog.toml); short ones keep a test on the
# tiny model fast.
_SHAPES: dict[str, dict[RequestClass, tuple[LengthDist, LengthDist]]] = {
    "chat-over-backlog": {
        RequestClass.INTERACTIVE: (
            LengthDist("uniform", min=83, max=275),
            LengthDist("fixed", value=32),
        ),
        RequestClass.BULK: (
            LengthDist("uniform", min=769, max=1519),
            LengthDist("fixed", value=128),
        ),
    },
    "short": {
        RequestClass.INTERACTIVE: (
            LengthDist("uniform", min=16, max=160),
            LengthDist("uniform", min=16, max=96),
        ),
        RequestClass.BULK: (
            LengthDist("uniform", min=64, max=384),
            LengthDist("uniform", min=32, max=160),
        ),
    },
}


def soak_workload(
    duration_s: float,
    chat_rate_per_s: float,
    job_rate_per_s: float,
    cancel_fraction: float,
    shape: str = "chat-over-backlog",
) -> Workload:
    """Poisson chat and jobs of `shape`'s lengths, a fraction of each cancelled mid-way."""
    cancel = Cancellation(cancel_fraction, "mid_stream", after_tokens=4)
    rates = {RequestClass.INTERACTIVE: chat_rate_per_s, RequestClass.BULK: job_rate_per_s}
    classes = {
        request_class: ClassLoad(
            request_class,
            Arrival("poisson", rate_per_s=rates[request_class]),
            prompt,
            output,
            cancel=cancel,
        )
        for request_class, (prompt, output) in _SHAPES[shape].items()
    }
    return Workload(
        name="soak",
        description=f"poisson chat and jobs ({shape} lengths) with mid-way cancellations",
        duration_s=duration_s,
        seed=7,
        classes=classes,
    )


@dataclass
class _Target:
    url: str
    rss: Callable[[], int | None]


def _rss_of_tree(pid: int | None) -> Callable[[], int | None]:
    """VmRSS of `pid` and every descendant: the gateway, its engine-core child and an
    embedded redis-server all count (a leak moved into a child must still show)."""

    def read() -> int | None:
        if pid is None:
            return None
        total, seen, todo = 0, set(), [pid]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            rss = _vmrss_bytes(current)
            if rss is None:
                if current == pid:
                    return None  # the server itself is gone
                continue
            total += rss
            todo.extend(_children(current))
        return total

    return read


def _vmrss_bytes(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    lines = [line for line in status.splitlines() if line.startswith("VmRSS:")]
    # NOTE: a zombie or kernel thread has no VmRSS line: it holds no user memory.
    return int(lines[0].split()[1]) * 1024 if lines else 0


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return children
    for task in tasks:
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


@contextlib.contextmanager
def _target(args: argparse.Namespace) -> Iterator[_Target]:
    if args.url is not None:
        yield _Target(args.url.rstrip("/"), _rss_of_tree(args.pid))
        return
    with tempfile.TemporaryDirectory(prefix="mixgate-soak-") as tmp:
        folder = Path(tmp)
        model_dir = Path(args.model) if args.model else None
        if model_dir is None:
            from engine.model.make_model import make_model

            model_dir = make_model(folder / "model", args.preset, seed=0)
        with redis_url(args.redis_url, folder / "redis") as url:
            server = ServerProcess(
                model_dir,
                url,
                f"{{soak-{uuid.uuid4().hex[:8]}}}:",
                folder / "server",
                extra_env={
                    "MIXGATE_NUM_THREADS": str(args.threads),
                    "MIXGATE_LEASE_S": "10",
                    "MIXGATE_LOG_LEVEL": "warning",
                },
            ).start()
            try:
                pid = server.process.pid if server.process is not None else None
                yield _Target(server.url, _rss_of_tree(pid))
            finally:
                server.stop()


def _sample(client: httpx.Client, target: _Target, t_s: float) -> SoakSample:
    text = client.get("/metrics", timeout=10).text
    return sample_from_metrics(text, t_s, target.rss())


# Idle samples the baseline is taken over (0.1 s apart), and the one with the most tasks kept.
# NOTE: an idle server's task count is not one number: while the dispatcher's claim loop is
# parked it holds a BZPOPMIN task per class and a stop watcher (3 tasks), which exist only
# between its claims; a replica that has just turned ready may not have parked yet. One sample
# taken at that moment read 13 tasks where every later idle reading was 16, and the settled
# server could then never come back "under" it (a CI run failed the leak check so). A leak
# only adds tasks after the baseline, so the most of a few idle samples hides none.
IDLE_BASELINE_SAMPLES = 5


def _idle_baseline(client: httpx.Client, target: _Target) -> SoakSample:
    samples = []
    for index in range(IDLE_BASELINE_SAMPLES):
        if index:
            time.sleep(0.1)
        samples.append(_sample(client, target, 0.0))
    return max(samples, key=lambda sample: sample.asyncio_tasks)


def _settle(
    client: httpx.Client, target: _Target, idle: SoakSample, timeout_s: float
) -> SoakSample:
    """The first sample with the engine idle, the KV cache empty and the tasks back (or the
    last one at the timeout: the verdict then says what did not come back)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sample = _sample(client, target, -1.0)
        settled = sample.running == 0 and sample.waiting == 0 and sample.kv_usage == 0.0
        if settled and sample.asyncio_tasks <= idle.asyncio_tasks:
            return sample
        if time.monotonic() >= deadline:
            return sample
        time.sleep(0.2)


async def _drive(
    target: _Target, workload: Workload, sample_s: float
) -> tuple[Any, list[SoakSample], float]:
    """Run the load and, beside it, sample the server every `sample_s` seconds."""
    samples: list[SoakSample] = []
    model = httpx.get(target.url + "/v1/models", timeout=10).json()["data"][0]["id"]
    t0 = time.monotonic()

    async def sampler() -> None:
        async with httpx.AsyncClient(base_url=target.url) as client:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    text = (await client.get("/metrics", timeout=10)).text
                    t_s = time.monotonic() - t0
                    samples.append(sample_from_metrics(text, t_s, target.rss()))
                await asyncio.sleep(sample_s)

    task = asyncio.create_task(sampler())
    try:
        result = await run_load(target.url, workload, model=model, progress=False, drain_s=10.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return result, samples, t0


def run_soak(args: argparse.Namespace) -> int:
    duration_s = args.minutes * 60.0
    workload = soak_workload(
        duration_s, args.chat_rate, args.job_rate, args.cancel_fraction, args.shape
    )
    sample_s = args.sample_s if args.sample_s is not None else max(0.5, duration_s / 30)
    with _target(args) as target, httpx.Client(base_url=target.url) as client:
        idle = _idle_baseline(client, target)
        result, load, t0 = asyncio.run(_drive(target, workload, sample_s))
        final = _settle(client, target, idle, args.settle_s)
        final = dataclasses.replace(final, t_s=time.monotonic() - t0)
    outcomes: dict[str, int] = {}
    server_errors = 0
    for record in result.records:
        key = f"{record.request_class}:{record.outcome}"
        if record.error_code or record.status_code not in (None, 200, 202):
            key += f"({record.status_code} {record.error_code})"
        outcomes[key] = outcomes.get(key, 0) + 1
        # NOTE: a 5xx, or a stream that broke without a status, is the server failing a
        # request it accepted; 429s (refusals) and client cancels are not.
        if (record.status_code or 0) >= 500 or record.outcome == ERROR:
            server_errors += 1
    verdict = judge(idle, load, final, int(args.max_rss_growth_mb * _MIB), server_errors)
    print(format_table([idle, *load, final], verdict))
    print("requests:", ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    report = {
        "minutes": args.minutes,
        "workload": workload.to_dict(),
        "idle": idle.to_dict(),
        "samples": [s.to_dict() for s in load],
        "final": final.to_dict(),
        "requests": outcomes,
        "verdict": verdict.to_dict(),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0 if verdict.ok else 1
