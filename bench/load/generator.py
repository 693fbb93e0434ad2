"""The load generator: drives a live `mixgate serve` with a workload, exactly as users do.

Interactive requests stream chat completions over SSE; bulk requests are jobs, submitted and
polled. One shared httpx.AsyncClient carries everything (a keep-alive pool big enough for
thousands of requests in flight), a sampler scrapes /metrics on a fixed grid, and the run
ends `drain_s` after the workload's duration: what is still in flight then is cancelled
(jobs DELETEd) and recorded incomplete.

    result = await run_load("http://127.0.0.1:8000", load_workload("mixed"), model="small")
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from bench.load.drive import LoadDriver, sample_loop
from bench.load.http_clients import HttpSender, Recorder
from bench.load.metrics_sampler import parse_metrics
from bench.load.progress import LoadProgress
from bench.load.records import MetricSample, RequestRecord
from bench.load.workload import PlannedRequest, Workload

__all__ = ["LoadResult", "offered_load", "run_load"]

# NOTE: far above what one client machine sends; the pool must never be what limits the
# offered load (a pool wait would silently turn open-loop traffic into closed-loop).
_MAX_CONNECTIONS = 16384
_SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class LoadResult:
    records: list[RequestRecord]
    samples: list[MetricSample]
    # Wall time of the run, drain included.
    duration_s: float
    # Per class: planned count, offered rate, planned prompt and output tokens.
    offered: dict[str, Any]


def offered_load(workload: Workload, issued: list[PlannedRequest]) -> dict[str, Any]:
    """What the workload asked of the server, per class (closed loop: what it got to send)."""
    offered: dict[str, Any] = {}
    for cls, load in workload.classes.items():
        mine = [req for req in issued if req.request_class is cls]
        offered[cls.value] = {
            "arrival": load.arrival.kind,
            "planned": len(mine),
            "rate_per_s": len(mine) / workload.duration_s,
            "prompt_tokens": sum(req.prompt_tokens for req in mine),
            "output_tokens": sum(req.max_tokens for req in mine),
        }
    return offered


async def _abandon(client: httpx.AsyncClient, recorder: Recorder) -> None:
    """Record what is left as incomplete and DELETE its jobs (a backlog outlives the run on
    purpose; the next run must not inherit it)."""

    async def delete(job_id: str) -> None:
        # A failed DELETE leaves the job queued; the record says incomplete either way.
        with contextlib.suppress(httpx.HTTPError):
            await client.delete(f"/v1/jobs/{job_id}")

    left = recorder.abandon_all()
    await asyncio.gather(*(delete(job_id) for _, job_id in left if job_id is not None))


async def run_load(
    base_url: str,
    workload: Workload,
    *,
    model: str,
    api_key: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    metrics_interval_s: float = 1.0,
    drain_s: float = 10.0,
    progress: bool = True,
    job_poll_s: float = 0.5,
    sender_class: type[HttpSender] = HttpSender,
    sender_options: dict[str, Any] | None = None,
    scrape_metrics: bool = True,
) -> LoadResult:
    """Drive `workload` against `base_url`. `sender_class` decides how each request is sent
    (mixgate's chat + jobs by default; `bench.baselines.vllm_loadgen.VllmSender` for a plain vLLM
    server, whose /metrics are its own, hence `scrape_metrics=False`)."""
    if not metrics_interval_s > 0:
        raise ValueError(f"metrics_interval_s: must be > 0, got {metrics_interval_s!r}")
    if not drain_s >= 0:
        raise ValueError(f"drain_s: must be >= 0, got {drain_s!r}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(
        max_connections=_MAX_CONNECTIONS, max_keepalive_connections=_MAX_CONNECTIONS
    )
    # Streams may sit in a queue for long; the drain, not a read timeout, bounds a run.
    timeout = httpx.Timeout(30.0, read=600.0, pool=None)
    samples: list[MetricSample] = []
    recorder = Recorder()
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=timeout
    ) as client:
        t0 = clock()
        sender = sender_class(
            client,
            recorder,
            model=model,
            seed=workload.seed,
            clock=clock,
            sleep=sleep,
            t0=t0,
            job_poll_s=job_poll_s,
            **(sender_options or {}),
        )
        driver = LoadDriver(workload, sender, clock=clock, sleep=sleep, t0=t0)

        async def scrape(t_s: float) -> None:
            try:
                response = await client.get("/metrics", timeout=_SCRAPE_TIMEOUT_S)
                samples.append(parse_metrics(response.text, t_s))
            except (httpx.HTTPError, ValueError):
                pass  # a missed sample is a gap in a plot, not a failed run

        sampler = (
            asyncio.get_running_loop().create_task(
                sample_loop(
                    scrape,
                    interval_s=metrics_interval_s,
                    now_s=driver.now_s,
                    sleep_until=driver.sleep_until,
                )
            )
            if scrape_metrics
            else None
        )
        with LoadProgress(workload, driver.plan, progress) as bar:
            recorder.listener = bar
            try:
                await driver.run_schedule()
                await driver.drain(drain_s)
            finally:
                # On an error too: no request task may outlive the client it uses.
                await driver.drain(0.0)
                if sampler is not None:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
                await sender.jobs.close()
                await _abandon(client, recorder)
        duration_s = clock() - t0
    records = sorted(recorder.finished, key=lambda rec: (rec.sent_s, rec.request_id))
    return LoadResult(records, samples, duration_s, offered_load(workload, driver.issued))
