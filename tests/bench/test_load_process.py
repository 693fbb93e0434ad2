"""The chat clients of a load run in their own process: whatever holds the bulk side's event
loop is not measured as chat latency, and the run still returns one seeded load's records.

Against a real `mixgate serve` on the tiny model. The verdicts are orderings, not speeds: the
bulk side's loop is held for a fixed 2 s at t=0, and chats planned inside that hold are sent
before it ends only when they have a loop of their own.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.live.processes import ServerProcess
from bench.load.generator import run_load
from bench.load.http_clients import HttpSender
from bench.load.records import OK, RequestRecord
from bench.load.workload import (
    Arrival,
    ClassLoad,
    LengthDist,
    PlannedRequest,
    Workload,
    plan_open_loop,
)
from policies.request_class import RequestClass

CHAT, BULK = RequestClass.INTERACTIVE, RequestClass.BULK
HOLD_S = 2.0


class LoopHoldingSender(HttpSender):
    """mixgate's sender whose bulk submission first holds its event loop for HOLD_S (what a
    burst of submissions did to the shared loop). Module-level: the chat process imports it."""

    # (run-relative time the hold ended,) per process that held (only the bulk side holds).
    hold_ended_s: list[float] = []

    async def _bulk(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        time.sleep(HOLD_S)  # noqa: ASYNC251 - holding the loop is the point
        LoopHoldingSender.hold_ended_s.append(self._clock() - self._t0)
        await super()._bulk(request, record, body, rng)


class DyingChatSender(HttpSender):
    """Its first chat kills the process that sends it: the chat process."""

    async def _chat(self, *args: Any, **kwargs: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def _load(cls: RequestClass, arrival: Arrival) -> ClassLoad:
    return ClassLoad(
        cls, arrival, LengthDist("fixed", value=40), LengthDist("uniform", min=4, max=8)
    )


HELD = Workload("held", "", 3.0, 5, {
    CHAT: _load(CHAT, Arrival("poisson", rate_per_s=6.0)),
    BULK: _load(BULK, Arrival("backlog", count=1)),
})  # fmt: skip
# The chats planned well inside the hold (the hold starts at t=0 with the one bulk job).
INSIDE = [r for r in plan_open_loop(HELD) if r.request_class is CHAT and r.at_s < HOLD_S / 2]


@pytest.fixture
def server(tiny_model_dir: Path, redis_server: str, tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        tiny_model_dir, redis_server, f"{{lp-{uuid.uuid4().hex[:8]}}}:", tmp_path / "data"
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


async def _run(server: ServerProcess, chat_process: bool) -> tuple[list[RequestRecord], float]:
    LoopHoldingSender.hold_ended_s.clear()
    result = await run_load(
        server.url, HELD, model=server.model_dir.name, drain_s=15.0, progress=False,
        job_poll_s=0.05, sender_class=LoopHoldingSender, chat_process=chat_process,
    )  # fmt: skip
    assert LoopHoldingSender.hold_ended_s, "the bulk side never held its loop"
    return result.records, LoopHoldingSender.hold_ended_s[0]


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_chats_are_sent_on_time_while_the_bulk_loop_is_held(server: ServerProcess) -> None:
    assert len(INSIDE) >= 2, "the seed must plan chats inside the hold"
    records, hold_end_s = await _run(server, chat_process=True)

    by_id = {r.request_id: r for r in records}
    # One run's records, both processes' together: every planned request exactly once.
    assert sorted(by_id) == sorted(
        f"{r.request_class.value}-{r.index}" for r in plan_open_loop(HELD)
    )
    assert all(r.outcome == OK for r in records), records
    for planned in INSIDE:
        chat = by_id[f"interactive-{planned.index}"]
        # Sent (and answered) while the bulk side's loop was still held.
        assert chat.sent_s < hold_end_s, (chat, hold_end_s)
        assert chat.ttft_s is not None and chat.sent_s + chat.ttft_s < hold_end_s

    # The same load with every class on one loop: those chats wait for the hold to end, and
    # their TTFT is measured from a send that was already late (what `mixed` measured).
    records, hold_end_s = await _run(server, chat_process=False)
    by_id = {r.request_id: r for r in records}
    for planned in INSIDE:
        assert by_id[f"interactive-{planned.index}"].sent_s >= hold_end_s


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.anyio
@pytest.mark.timeout(90)
async def test_a_dead_chat_process_fails_the_run(server: ServerProcess) -> None:
    # Its chats' records died with it: the run must say so, not report the bulk side alone.
    with pytest.raises(RuntimeError, match="ended early"):
        await run_load(
            server.url, HELD.only(CHAT), model=server.model_dir.name, drain_s=1.0,
            progress=False, sender_class=DyingChatSender,
        )  # fmt: skip


@pytest.mark.anyio
async def test_a_sender_the_chat_process_cannot_import_is_refused() -> None:
    class Local(HttpSender):
        pass

    with pytest.raises(ValueError, match="module-level"):
        await run_load("http://127.0.0.1:1", HELD, model="m", sender_class=Local)
    with pytest.raises(ValueError, match="monotonic"):
        await run_load("http://127.0.0.1:1", HELD, model="m", clock=lambda: 0.0)
