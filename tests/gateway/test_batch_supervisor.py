"""The batch supervisor against a real redis-server, without an engine: the test plays the
dispatcher (claim, complete) and moves the clock, so expiry, the queue bound, cancellation and
replays after a crash are exercised deterministically."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from engine.core.sampling_params import SamplingParams
from gateway.batch.file_storage import LocalFileStorage
from gateway.batch.files import FileStore
from gateway.batch.keys import BatchKeys
from gateway.batch.records import BatchRecord, BatchStatus
from gateway.batch.store import BatchStore
from gateway.batch.supervisor import Supervisor, SupervisorConfig
from gateway.batch.todo import TodoLine
from gateway.queue import JobStatus, Keys, QueueStore
from gateway.queue.payload import JobPayload
from policies.request_class import RequestClass

pytestmark = [pytest.mark.redis, pytest.mark.anyio]
T0_MS = 1_700_000_000_000
WINDOW_S = 60


@dataclass
class Rig:
    redis: aioredis.Redis
    queue: QueueStore
    batches: BatchStore
    files: FileStore
    now_ms: int = T0_MS

    def supervisor(self, *, bulk_queue_limit: int = 100, max_queued_lines: int = 100) -> Supervisor:
        config = SupervisorConfig(0.01, 5_000, max_queued_lines, 3, bulk_queue_limit)
        return Supervisor(
            self.batches, self.files, self.queue, config, clock_ms=lambda: self.now_ms
        )

    @staticmethod
    def todo_line(n: int) -> str:
        payload = JobPayload((1, 2, 3), SamplingParams(max_tokens=4), "tiny", T0_MS // 1000)
        return TodoLine(n, f"c{n}", payload.to_json(), 3, 7).to_json()

    async def create(self, lines: int) -> str:
        batch_id = "batch_" + uuid.uuid4().hex[:12]
        todo = [self.todo_line(n) for n in range(1, lines + 1)]
        fields: dict[str, str | int] = {
            "id": batch_id, "tenant": "t", "status": "validating", "stop": "",
            "endpoint": "/v1/chat/completions", "input_file_id": "file-x",
            "completion_window": f"{WINDOW_S}s", "model": "tiny", "metadata": "{}",
            "created_at": T0_MS // 1000, "expires_at": T0_MS // 1000 + WINDOW_S,
            "total": lines, "completed": 0, "failed": 0, "errors": "",
        }  # fmt: skip
        await self.batches.create(fields, todo, {}, T0_MS, active=True)
        return batch_id

    async def run_jobs(self, count: int, *, finish: bool = True) -> list[tuple[str, int]]:
        """Claim up to `count` bulk jobs; complete them unless told not to."""
        claimed = []
        for _ in range(count):
            result = await self.queue.claim(
                [RequestClass.BULK], self.now_ms, 60_000, "r1", {RequestClass.BULK: 0}
            )
            if result.claimed is None:
                break
            job_id, token = result.claimed.job.job_id, result.claimed.lease_token
            if finish:
                usage = {"prompt_tokens": 3, "completion_tokens": 4}
                result_json = json.dumps({"text": f"out {job_id}", "finish_reason": "length",
                                          "usage": usage, "timings": {}})  # fmt: skip
                assert await self.queue.complete(
                    job_id, token, JobStatus.COMPLETED, result_json, None, self.now_ms
                )
            claimed.append((job_id, token))
        return claimed

    async def batch(self, batch_id: str) -> BatchRecord:
        record = await self.batches.get(batch_id, "t")
        assert record is not None
        return record

    async def lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        record = await self.files.get(file_id, "t")
        assert record is not None
        return [json.loads(x) for x in (await self.files.read(record)).decode().splitlines()]


@pytest.fixture
async def rig(redis_server: str, tmp_path: Path) -> AsyncIterator[Rig]:
    client = aioredis.Redis.from_url(redis_server, decode_responses=True)
    keys = Keys(f"{{bt-{uuid.uuid4().hex[:8]}}}:")
    queue = QueueStore(client, keys)
    batches = BatchStore(client, BatchKeys(keys), queue)
    files = FileStore(client, batches.keys, LocalFileStorage(tmp_path), batches.scripts)
    yield Rig(client, queue, batches, files)
    await client.aclose()


async def test_feeding_respects_the_queue_bound_and_each_line_is_recorded_once(rig: Rig) -> None:
    batch_id = await rig.create(7)
    supervisor = rig.supervisor(bulk_queue_limit=3)
    await supervisor.run_once()
    assert (await rig.batch(batch_id)).status is BatchStatus.IN_PROGRESS
    assert (await rig.queue.depths())[RequestClass.BULK].jobs == 3
    assert await rig.batches.todo_count(batch_id) == 4
    # A crash between admitting a line and popping it from the todo list replays the feed:
    # admit refuses the duplicate id and the line still yields one result.
    await rig.run_jobs(1)
    await supervisor.run_once()
    assert (await rig.batch(batch_id)).completed == 1
    await rig.redis.lpush(rig.batches.keys.todo(batch_id), rig.todo_line(1))
    for _ in range(10):
        await rig.run_jobs(3)
        await supervisor.run_once()
    done = await rig.batch(batch_id)
    assert done.status is BatchStatus.COMPLETED, done
    assert (done.total, done.completed, done.failed) == (7, 7, 0)
    output = await rig.lines(done.output_file_id)
    assert [row["custom_id"] for row in output] == [f"c{n}" for n in range(1, 8)]
    assert done.error_file_id is None
    # Finished batches leave nothing behind but the batch and its files.
    assert batch_id not in await rig.batches.active_ids()
    assert not await rig.redis.exists(rig.batches.keys.results(batch_id))


async def test_an_expired_window_keeps_finished_lines_and_reports_the_rest(rig: Rig) -> None:
    batch_id = await rig.create(6)
    supervisor = rig.supervisor()
    await supervisor.run_once()
    await rig.run_jobs(2)
    [(running_id, token)] = await rig.run_jobs(1, finish=False)
    await supervisor.run_once()
    assert (await rig.batch(batch_id)).completed == 2
    rig.now_ms = T0_MS + (WINDOW_S + 1) * 1000
    await supervisor.run_once()
    # The running line was asked to stop; its replica aborts it and completes it cancelled.
    assert await rig.queue.complete(running_id, token, JobStatus.CANCELLED, None, None, rig.now_ms)
    await supervisor.run_once()
    done = await rig.batch(batch_id)
    assert done.status is BatchStatus.EXPIRED and done.times_s["expired_at"] is not None
    assert (done.completed, done.failed) == (2, 4)
    errors = await rig.lines(done.error_file_id)
    assert len(errors) == 4 and {r["error"]["code"] for r in errors} == {"batch_expired"}
    assert len(await rig.lines(done.output_file_id)) == 2


async def test_cancel_stops_queued_lines_and_one_replica_holds_a_batch_at_a_time(rig: Rig) -> None:
    batch_id = await rig.create(5)
    supervisor = rig.supervisor(max_queued_lines=2)
    await supervisor.run_once()
    await rig.run_jobs(1)
    cancel = {"stop": "cancelled", "cancelling_at": 1}
    assert await rig.batches.transition(batch_id, ["in_progress"], "cancelling", cancel) == "ok"
    assert await rig.batches.try_lock(batch_id, "other-replica", 60_000)
    assert await supervisor.run_once() == 0  # locked out: nothing moved
    assert (await rig.batch(batch_id)).status is BatchStatus.CANCELLING
    await rig.batches.unlock(batch_id, "other-replica")
    await supervisor.run_once()
    done = await rig.batch(batch_id)
    assert done.status is BatchStatus.CANCELLED, done
    assert (done.completed, done.failed) == (1, 4)
    assert (await rig.queue.depths())[RequestClass.BULK].jobs == 0
    errors = await rig.lines(done.error_file_id)
    assert sorted(r["custom_id"] for r in errors) == ["c2", "c3", "c4", "c5"]
    assert {r["error"]["code"] for r in errors} == {"batch_cancelled"}
