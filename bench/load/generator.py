"""The load generator: drives a live `mixgate serve` with a workload, exactly as users do.

Interactive requests stream chat completions over SSE; bulk requests are jobs, submitted and
polled. The chat clients run in a process of their own (bench/load/process.py), so that
nothing the bulk side does on its event loop is measured as chat latency; the bulk side and
the /metrics sampler run here. Both send the one seeded schedule on one t0 and talk through
an aiohttp session each (bench/load/client.py). The run ends `drain_s` after the workload's
duration: what is still in flight then is cancelled (jobs DELETEd) and recorded incomplete.

    result = await run_load("http://127.0.0.1:8000", load_workload("mixed"), model="small")
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.load.client import LOAD_ERRORS, LoadClient, warm_up
from bench.load.drive import LoadDriver, sample_loop
from bench.load.frozen_heap import heap_frozen
from bench.load.http_clients import HttpSender, Recorder
from bench.load.metrics_sampler import parse_metrics
from bench.load.process import CLIENT_TIMEOUT, ClassProcess, PartSpec, run_part
from bench.load.progress import LoadProgress
from bench.load.records import MetricSample, RequestRecord
from bench.load.workload import PlannedRequest, Workload, plan_open_loop
from policies.request_class import RequestClass

__all__ = ["LoadResult", "offered_load", "run_load"]

_SCRAPE_TIMEOUT_S = 5.0
# A missed /metrics sample (refused, timed out, unparsable) is a gap in a plot.
_SCRAPE_ERRORS: tuple[type[BaseException], ...] = (*LOAD_ERRORS, ValueError)
# How long the chat process may take beyond its own drain to hand its records back.
_PART_RESULT_GRACE_S = 60.0


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
    chat_process: bool = True,
) -> LoadResult:
    """Drive `workload` against `base_url`. `sender_class` decides how each request is sent
    (mixgate's chat + jobs by default; `bench.baselines.vllm_loadgen.VllmSender` for a plain vLLM
    server, whose /metrics are its own, hence `scrape_metrics=False`).

    `chat_process`: the interactive class is sent from a child process (the sender class must
    then be a module-level class, and time the system's monotonic clock); False sends every
    class from this event loop, as the load generator did before.
    """
    if not metrics_interval_s > 0:
        raise ValueError(f"metrics_interval_s: must be > 0, got {metrics_interval_s!r}")
    if not drain_s >= 0:
        raise ValueError(f"drain_s: must be >= 0, got {drain_s!r}")
    apart = (
        frozenset({RequestClass.INTERACTIVE} & set(workload.classes))
        if chat_process
        else frozenset()
    )
    if apart and (clock is not time.monotonic or sleep is not asyncio.sleep):
        raise ValueError("a chat process runs on the system's monotonic clock: chat_process=False")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    options = dict(sender_options or {})
    samples: list[MetricSample] = []
    recorder = Recorder()
    part = (
        await ClassProcess.start(
            PartSpec(
                base_url,
                headers,
                workload,
                apart,
                model,
                sender_class,
                options,
                job_poll_s,
                drain_s,
            )  # fmt: skip
        )
        if apart
        else None
    )
    try:
        async with (
            LoadClient(base_url, headers=headers, timeout=CLIENT_TIMEOUT) as client,
            contextlib.AsyncExitStack() as run_scope,
        ):
            await warm_up(client)
            run_scope.enter_context(heap_frozen())
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
                **options,
            )
            here = frozenset(workload.classes) - apart
            driver = LoadDriver(workload, sender, clock=clock, sleep=sleep, t0=t0, classes=here)

            async def scrape(t_s: float) -> None:
                try:
                    response = await client.get("/metrics", timeout_s=_SCRAPE_TIMEOUT_S)
                    samples.append(parse_metrics(response.text, t_s))
                except _SCRAPE_ERRORS:
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
            with LoadProgress(workload, plan_open_loop(workload), progress) as bar:
                recorder.listener = bar
                if part is not None:
                    part.go(t0, bar)
                try:
                    await run_part(driver, sender, client, recorder, drain_s)
                    issued = list(driver.issued)
                    if part is not None:
                        theirs = await part.result(drain_s + _PART_RESULT_GRACE_S)
                        recorder.finished.extend(theirs.records)
                        issued += theirs.issued
                finally:
                    if sampler is not None:
                        sampler.cancel()
                        await asyncio.gather(sampler, return_exceptions=True)
            duration_s = clock() - t0
    finally:
        if part is not None:
            part.close()
    records = sorted(recorder.finished, key=lambda rec: (rec.sent_s, rec.request_id))
    return LoadResult(records, samples, duration_s, offered_load(workload, issued))
