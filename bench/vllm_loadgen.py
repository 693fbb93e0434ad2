"""Driving a plain vLLM server the way its users would, with the same seeded workload.

Interactive requests stream chat completions over SSE (as against mixgate); bulk requests
are concurrent non-streamed chat completions, with `priority: 1` when the server schedules by
priority (vLLM refuses a priority under fcfs). Records are the same `RequestRecord`s, so the
summary, report and plots read both alike. vLLM has no queue and no admission: every request
is in flight until it is answered.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx

from bench.loadgen import LoadResult, offered_load
from bench.loadgen_drive import LoadDriver
from bench.loadgen_http import HttpSender, Recorder, _refused
from bench.loadgen_progress import LoadProgress
from bench.records import OK, RequestRecord
from bench.workload import PlannedRequest, Workload
from policies.request_class import RequestClass

__all__ = ["VllmSender", "run_vllm_load"]

_PRIORITY = {RequestClass.INTERACTIVE: 0, RequestClass.BULK: 1}


class VllmSender(HttpSender):
    """`HttpSender` with bulk as plain chat completions and the class as vLLM's priority."""

    def __init__(self, *args: Any, use_priority: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._use_priority = use_priority

    def _class_fields(self, request_class: RequestClass) -> dict[str, Any]:
        return {"priority": _PRIORITY[request_class]} if self._use_priority else {}

    async def _bulk(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        await self._completion(record, body)

    async def _completion(self, record: RequestRecord, body: dict[str, Any]) -> None:
        sent = self._clock()
        response = await self._client.post("/v1/chat/completions", json=body)
        if response.status_code != 200:
            _refused(record, response, response.content)
            return
        record.status_code = 200
        record.e2e_s = self._clock() - sent
        usage = response.json().get("usage") or {}
        record.output_tokens = int(usage.get("completion_tokens", 0))
        record.outcome = OK


async def run_vllm_load(
    base_url: str, workload: Workload, *, model: str, use_priority: bool, drain_s: float = 10.0
) -> LoadResult:
    """`bench.loadgen.run_load` against vLLM (no /metrics sampling: vLLM's are its own)."""
    clock, sleep = time.monotonic, asyncio.sleep
    limits = httpx.Limits(max_connections=16384, max_keepalive_connections=16384)
    timeout = httpx.Timeout(30.0, read=600.0, pool=None)
    recorder = Recorder()
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        t0 = clock()
        sender = VllmSender(
            client,
            recorder,
            model=model,
            seed=workload.seed,
            clock=clock,
            sleep=sleep,
            t0=t0,
            job_poll_s=0.5,
            use_priority=use_priority,
        )
        driver = LoadDriver(workload, sender, clock=clock, sleep=sleep, t0=t0)
        with LoadProgress(workload, driver.plan, True) as bar:
            recorder.listener = bar
            try:
                await driver.run_schedule()
                await driver.drain(drain_s)
            finally:
                # Cancelled requests close their connections; vLLM aborts them.
                await driver.drain(0.0)
                await sender.jobs.close()
                recorder.abandon_all()
        duration_s = clock() - t0
    records = sorted(recorder.finished, key=lambda rec: (rec.sent_s, rec.request_id))
    return LoadResult(records, [], duration_s, offered_load(workload, driver.issued))
