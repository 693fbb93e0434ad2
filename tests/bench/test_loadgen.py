"""The load generator: its schedule on a virtual clock, /metrics parsing, and a live smoke run
against a real `mixgate serve` on the tiny model."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import uuid
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bench.live.processes import ServerProcess
from bench.load.drive import LoadDriver, sample_loop
from bench.load.generator import run_load
from bench.load.metrics_sampler import parse_metrics
from bench.load.records import CANCELLED, OK, OUTCOMES
from bench.load.workload import (
    Arrival,
    Cancellation,
    ClassLoad,
    LengthDist,
    PlannedRequest,
    Workload,
    plan_open_loop,
)
from policies.request_class import RequestClass

CHAT, BULK = RequestClass.INTERACTIVE, RequestClass.BULK
T = TypeVar("T")


class VirtualTime:
    """A clock that only moves when every task is asleep: then it jumps to the earliest wake-up.
    No real sleeping, and sleeps of concurrent tasks overlap as they would in real time."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay_s: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self.now + max(0.0, delay_s), next(self._seq), future))
        await future

    async def run(self, main: Awaitable[T]) -> T:
        task = asyncio.ensure_future(main)
        while not task.done():
            for _ in range(50):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            if task.done():
                break
            wake_s, _, future = heapq.heappop(self._waiters)
            if not future.cancelled():
                self.now = max(self.now, wake_s)
                future.set_result(None)
        return task.result()


def _load(cls: RequestClass, arrival: Arrival, **kwargs: Any) -> ClassLoad:
    return ClassLoad(
        cls, arrival, LengthDist("fixed", value=40), LengthDist("uniform", min=8, max=16), **kwargs
    )


def _driver(vt: VirtualTime, workload: Workload, service_s: float, log: list[Any]) -> LoadDriver:
    async def send(request: PlannedRequest) -> float:
        log.append((round(vt.clock() - driver.t0, 9), request))
        await vt.sleep(service_s)
        return 0.0

    driver = LoadDriver(workload, send, clock=vt.clock, sleep=vt.sleep, t0=vt.clock())
    return driver


def test_open_loop_requests_go_out_at_their_planned_times_in_order() -> None:
    workload = Workload("w", "", 10.0, 7, {
        CHAT: _load(CHAT, Arrival("poisson", rate_per_s=5.0)),
        BULK: _load(BULK, Arrival("backlog", count=3)),
    })  # fmt: skip
    vt = VirtualTime()
    log: list[Any] = []
    driver = _driver(vt, workload, service_s=0.5, log=log)

    async def main() -> int:
        await driver.run_schedule()
        assert vt.clock() - driver.t0 == pytest.approx(10.0)  # the schedule spans duration_s
        return await driver.drain(5.0)

    assert asyncio.run(vt.run(main())) == 0
    plan = plan_open_loop(workload)
    assert [req for _, req in log] == plan == driver.issued
    assert [t for t, _ in log] == pytest.approx([req.at_s for req in plan], abs=1e-9)
    # The drain ended with the last answer, not after its full 5 s.
    assert vt.clock() - driver.t0 == pytest.approx(max(10.0, plan[-1].at_s + 0.5))


def test_closed_loop_clients_send_when_the_previous_answer_arrives() -> None:
    workload = Workload("w", "", 5.0, 1, {CHAT: _load(CHAT, Arrival("closed", concurrency=2))})
    vt = VirtualTime()
    log: list[Any] = []
    driver = _driver(vt, workload, service_s=1.0, log=log)

    async def main() -> None:
        await driver.run_schedule()
        await driver.drain(10.0)

    asyncio.run(vt.run(main()))
    assert sorted(t for t, _ in log) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert sorted(req.index for _, req in log) == list(range(10))


def test_drain_cancels_what_is_still_in_flight_after_drain_s() -> None:
    workload = Workload("w", "", 2.0, 1, {BULK: _load(BULK, Arrival("backlog", count=4))})
    vt = VirtualTime()
    driver = _driver(vt, workload, service_s=100.0, log=[])

    async def main() -> int:
        await driver.run_schedule()
        return await driver.drain(3.0)

    assert asyncio.run(vt.run(main())) == 4
    assert vt.clock() - driver.t0 == pytest.approx(5.0)


def test_sampler_ticks_on_its_interval_and_skips_overrun_ticks() -> None:
    vt = VirtualTime()
    t0 = vt.clock()
    ticks: list[float] = []

    async def scrape(t_s: float) -> None:
        ticks.append(round(t_s, 9))
        # The scrape at t=3 takes 2.5 s: the ticks at 4 and 5 are skipped, not bunched.
        await vt.sleep(2.5 if t_s == 3.0 else 0.2)

    async def sleep_until(at_s: float) -> None:
        await vt.sleep(at_s - (vt.clock() - t0))

    async def main() -> None:
        sampler = asyncio.ensure_future(
            sample_loop(
                scrape, interval_s=1.0, now_s=lambda: vt.clock() - t0, sleep_until=sleep_until
            )  # fmt: skip
        )
        await vt.sleep(8.5)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)

    asyncio.run(vt.run(main()))
    assert ticks == [0.0, 1.0, 2.0, 3.0, 6.0, 7.0, 8.0]


def test_parse_metrics() -> None:
    text = (
        "# TYPE mixgate_queue_depth gauge\n"
        'mixgate_queue_depth{class="interactive"} 2.0\nmixgate_queue_depth{class="bulk"} 40.0\n'
        "# TYPE mixgate_queued_tokens gauge\n"
        'mixgate_queued_tokens{class="bulk"} 51200.0\n'
        "# TYPE mixgate_engine_running gauge\n"
        'mixgate_engine_running{class="interactive"} 3.0\n'
        "# TYPE mixgate_kv_cache_usage gauge\nmixgate_kv_cache_usage 0.75\n"
        "# TYPE mixgate_preemptions counter\nmixgate_preemptions_total 4.0\n"
        "# TYPE mixgate_engine_steps counter\nmixgate_engine_steps_total 1234.0\n"
    )
    sample = parse_metrics(text, 1.5)
    assert sample.t_s == 1.5
    assert sample.queue_depth == {"interactive": 2.0, "bulk": 40.0}
    assert sample.queued_tokens == {"bulk": 51200.0}
    assert sample.running == {"interactive": 3.0}
    assert (sample.kv_usage, sample.preemptions, sample.steps) == (0.75, 4.0, 1234.0)


# ---- live: a real `mixgate serve` on the tiny model ------------------------------------------


@pytest.fixture
def server(tiny_model_dir: Path, redis_server: str, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tiny_model_dir, redis_server, f"{{lg-{uuid.uuid4().hex[:8]}}}:", tmp_path / "data"
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


SMOKE = Workload("smoke", "", 4.0, 11, {
    CHAT: _load(CHAT, Arrival("poisson", rate_per_s=3.0),
             cancel=Cancellation(0.3, "mid_stream", after_tokens=3)),
    BULK: _load(BULK, Arrival("backlog", count=6), cancel=Cancellation(0.3, "before_first_token")),
})  # fmt: skip


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_live_smoke(server: ServerProcess) -> None:
    plan = plan_open_loop(SMOKE)
    assert any(r.cancel for r in plan if r.request_class is CHAT)
    assert any(r.cancel for r in plan if r.request_class is BULK)

    result = await run_load(
        server.url, SMOKE, model=server.model_dir.name, metrics_interval_s=0.5, drain_s=15.0,
        progress=False, job_poll_s=0.05,
    )  # fmt: skip

    assert len(result.records) == len(plan)
    assert {r.outcome for r in result.records} <= set(OUTCOMES)
    by_id = {r.request_id: r for r in result.records}
    for request in plan:
        record = by_id[f"{request.request_class.value}-{request.index}"]
        assert record.outcome == (CANCELLED if request.cancel else OK), (record, server.logs())
        assert record.scheduled_s == request.at_s and record.sent_s >= request.at_s
        if record.outcome != OK:
            continue
        assert record.output_tokens == request.max_tokens
        assert record.ttft_s is not None and record.e2e_s is not None
        assert 0 < record.ttft_s <= record.e2e_s
        if request.request_class is CHAT:
            assert len(record.itls_s) >= 1 and all(gap >= 0 for gap in record.itls_s)
    assert len(result.samples) >= 4
    assert any(sample.steps > 0 for sample in result.samples)
    assert result.offered["interactive"]["planned"] == sum(r.request_class is CHAT for r in plan)
    assert result.offered["bulk"]["planned"] == 6
    assert result.duration_s >= 4.0
