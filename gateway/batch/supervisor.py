"""The batch supervisor: runs on every replica and moves each active batch forward.

Every `poll_interval_s` it walks the active batches; for each it takes the batch's lock
(``SET NX PX`` with a random token; status changes are fenced by that token) so that one
replica at a time advances it, then, in one pass:

1. ``validating`` -> ``in_progress``; past ``expires_at`` the batch is marked to stop (expired);
2. records the outcome of every fed line whose job is terminal (`batch_record.lua`: exactly once,
   durably in Redis with AOF, as lines finish);
3. stopping (cancel or expiry): cancels the open line jobs through the queue's cancel path and
   turns the lines never fed into error lines; otherwise feeds more lines to the bulk queue
   (deterministic job ids ``{batch_id}-{line}``: a replay after a crash is a duplicate that
   admit refuses), at most `max_queued_lines` of the batch at a time and only while the bulk
   queue has room;
4. when no line is left to feed or to wait for: writes the output and error files and sets the
   terminal status (`gateway.batch.finalize`).

Every step is idempotent, so a replica that dies mid-pass (or loses its lock) leaves nothing
that the next pass cannot finish.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from gateway.batch.files import FileStore
from gateway.batch.finalize import finalize
from gateway.batch.records import BatchRecord, BatchStatus, StopReason
from gateway.batch.result_lines import line_job_id, line_number, outcome_line, skipped_line
from gateway.batch.store import BatchStore, PassAborted
from gateway.batch.todo import TodoLine
from gateway.queue import AdmitStatus, JobRecord, JobStatus, NewJob, QueueStore
from policies.request_class import RequestClass

__all__ = ["Supervisor", "SupervisorConfig"]

log = structlog.get_logger("mixgate.batch")
_TERMINAL_JOB = frozenset(s.value for s in JobStatus if s.terminal)
# Lines turned into error lines per command when a batch stops.
_STOP_CHUNK = 1000


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    poll_interval_s: float
    lock_ms: int
    # A batch's lines in the bulk queue (queued or running) at once: room stays for other
    # bulk work, and a huge batch never fills the class bound by itself.
    max_queued_lines: int
    max_attempts: int
    # The bulk class's queue bound from the envelope (admit.lua checks it atomically).
    bulk_queue_limit: int

    def __post_init__(self) -> None:
        if self.poll_interval_s <= 0 or self.lock_ms < 1 or self.max_queued_lines < 1:
            raise ValueError("poll_interval_s, lock_ms and max_queued_lines must be positive")


class Supervisor:
    def __init__(
        self,
        store: BatchStore,
        files: FileStore,
        queue: QueueStore,
        config: SupervisorConfig,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.store = store
        self.files = files
        self.queue = queue
        self.config = config
        self._clock_ms = clock_ms

    async def run(self) -> None:
        """Forever (cancelled at shutdown: every step is safe to interrupt)."""
        failing = False
        while True:
            try:
                await self.run_once()
                failing = False
            except Exception:  # Redis down or a bug: try again next round, log once a streak
                if not failing:
                    log.warning("batch_supervisor_round_failed", exc_info=True)
                failing = True
            await asyncio.sleep(self.config.poll_interval_s)

    async def run_once(self) -> int:
        """One pass over the active batches; returns how many this replica advanced."""
        advanced = 0
        for batch_id in await self.store.active_ids():
            token = secrets.token_hex(8)
            if not await self.store.try_lock(batch_id, token, self.config.lock_ms):
                continue  # another replica is on it
            try:
                await self.advance(batch_id, token)
                advanced += 1
            except PassAborted as why:
                log.info("batch_pass_aborted", batch_id=batch_id, reason=str(why))
            except Exception:
                log.exception("batch_advance_failed", batch_id=batch_id)
            finally:
                await self.store.unlock(batch_id, token)
        return advanced

    async def advance(self, batch_id: str, token: str) -> None:
        record = await self.store.get(batch_id, None)
        if record is None or record.status.terminal:
            await self.store.cleanup(batch_id)
            return
        now_ms = self._clock_ms()
        if record.status is BatchStatus.VALIDATING:
            await self._set(record, [BatchStatus.VALIDATING], BatchStatus.IN_PROGRESS, token,
                            in_progress_at=now_ms // 1000)  # fmt: skip
        stop = record.stop
        if stop is StopReason.NONE and now_ms >= record.expires_at_s * 1000:
            stop = StopReason.EXPIRED
            await self._set(record, [s.value for s in BatchStatus if not s.terminal], None,
                            token, stop=stop.value)  # fmt: skip
        await self._record_finished(record, stop)
        if stop is StopReason.NONE:
            await self._feed(record, now_ms)
        else:
            await self._stop_lines(record, stop, now_ms)
            await self._record_finished(record, stop)
        if await self.store.todo_count(batch_id) or await self.store.open_count(batch_id):
            return
        fresh = await self.store.get(batch_id, None)
        if fresh is not None and not fresh.status.terminal:
            await finalize(self.store, self.files, fresh, token, self._clock_ms() // 1000)
            await self.store.cleanup(batch_id)

    async def _set(
        self,
        record: BatchRecord,
        allowed: list[BatchStatus] | list[str],
        to: BatchStatus | None,
        token: str,
        **fields: str | int,
    ) -> str:
        outcome = await self.store.transition(
            record.batch_id, [str(s) for s in allowed], to.value if to else "", fields, token
        )
        if outcome == "stale":
            raise PassAborted(f"the lock on {record.batch_id} lapsed")
        return outcome

    async def _record_finished(self, record: BatchRecord, stop: StopReason) -> None:
        open_ids = await self.store.open_jobs(record.batch_id)
        if not open_ids:
            return
        statuses = await self.store.job_statuses(open_ids)
        done = [j for j, s in zip(open_ids, statuses, strict=True) if s in _TERMINAL_JOB or not s]
        for job_id, raw in zip(done, await self.store.job_hashes(done), strict=True):
            if raw:
                ok, text = outcome_line(JobRecord.from_hash(raw), stop)
            else:  # the job's hash is gone (deleted by hand): the line cannot be recovered
                ok, text = False, skipped_line(job_id, None, StopReason.CANCELLED)
            await self.store.record(record.batch_id, line_number(job_id), ok, text, job_id)

    async def _feed(self, record: BatchRecord, now_ms: int) -> None:
        room = self.config.max_queued_lines - await self.store.open_count(record.batch_id)
        entries = [TodoLine.from_json(t) for t in await self.store.todo_head(record.batch_id, room)]
        if not entries:
            return
        jobs = [
            NewJob(
                job_id=line_job_id(record.batch_id, entry.line),
                tenant=record.tenant,
                request_class=RequestClass.BULK,
                request_json=entry.request_json,
                enqueue_ms=now_ms,
                cost_tokens=entry.cost_tokens,
                queue_limit=self.config.bulk_queue_limit,
                # The window bounds every line: the claim script expires what has not started.
                deadline_ms=record.expires_at_s * 1000,
                max_attempts=self.config.max_attempts,
                custom_id=entry.custom_id,
            )
            for entry in entries
        ]
        statuses = await self.store.feed(record.batch_id, jobs)
        fed = next(
            (i for i, s in enumerate(statuses) if s is AdmitStatus.QUEUE_FULL), len(statuses)
        )
        await self.store.pop_todo(record.batch_id, fed)

    async def _stop_lines(self, record: BatchRecord, stop: StopReason, now_ms: int) -> None:
        open_ids = await self.store.open_jobs(record.batch_id)
        statuses = await self.store.job_statuses(open_ids)
        for job_id, status in zip(open_ids, statuses, strict=True):
            if status and status not in _TERMINAL_JOB:
                # Queued: cancelled at once; running: its replica aborts it (flag + publish).
                await self.queue.cancel(job_id, record.tenant, now_ms)
        while entries := await self.store.todo_head(record.batch_id, _STOP_CHUNK):
            for text in entries:
                entry = TodoLine.from_json(text)
                job_id = line_job_id(record.batch_id, entry.line)
                line = skipped_line(job_id, entry.custom_id, stop)
                await self.store.record(record.batch_id, entry.line, False, line, "")
            await self.store.pop_todo(record.batch_id, len(entries))
