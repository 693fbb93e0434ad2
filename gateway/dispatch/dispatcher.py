"""`Dispatcher`: every replica's link from the Redis queues to its local engine.

Background tasks: the claim loop (lease work while a class has a free local slot; block on the
wake-up key when nothing is claimable, on a local job's end when every slot is taken), the
lease loop (renew every local lease; a stale one is aborted here and never completed), the
reclaim sweep (lapsed leases of any replica back to their queue) and the cancel listener
(`gateway.dispatch.cancels`). Each claimed job runs in its own task (`gateway.dispatch.job_run`).

`run_until_idle()` is the drain-and-return mode: claim until nothing is claimable, finish the
local jobs, return. Tests and one-shot batch runs use it instead of sleeping.

Over 400 lines on purpose: the claim loop, the lease loop, reclaim, cancel and drain all read
and change one table of local jobs and slot counts under one invariant (a job is in the table
exactly while this replica holds its lease); what could leave already has (cancels, job_run,
notices, retry, waits, config, events).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
import structlog

from engine.process.async_engine import AsyncEngine
from gateway.dispatch.cancels import CancelListener, cancel_flags_set
from gateway.dispatch.config import DispatcherConfig
from gateway.dispatch.events import (
    DispatchCounters,
    DispatchEvent,
    DispatchEventKind,
    DispatchHook,
    FinishedHook,
    combine_hooks,
)
from gateway.dispatch.job_run import JobRunner
from gateway.dispatch.local_job import LocalJob
from gateway.dispatch.notices import ScriptOutcomes
from gateway.dispatch.retry import Backoff
from gateway.dispatch.token_stream import TokenStreams
from gateway.dispatch.waits import ClaimWaits
from gateway.dispatch.work_in_flight import WorkInFlight
from gateway.queue import AdmitResult, AdmitStatus, ClaimedJob, NewJob, QueueStore, ReclaimResult
from gateway.runtime.bounded_cancel import cancel_and_wait
from policies.request_class import RequestClass

__all__ = ["DispatchEvent", "DispatchEventKind", "Dispatcher", "DispatcherConfig", "DrainResult"]

log = structlog.get_logger("mixgate.dispatcher")

# Cancel messages for jobs not (yet) local, remembered in case their claim reply is still on
# its way: the claim script read the flag before the cancel set it, and the message came first.
_UNMATCHED_CANCELS_KEPT = 1024


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class DrainResult:
    # Local jobs that ended (with any outcome) before the drain timeout.
    finished: int
    # Jobs aborted at the timeout whose leases went back to the queue (they run again).
    handed_back: tuple[str, ...]
    # Jobs aborted at the timeout whose hand-back failed or was refused (the lease was no
    # longer ours): a lease still held lapses, and a reclaim sweep requeues it.
    not_handed_back: tuple[str, ...]


class Dispatcher:
    def __init__(
        self,
        store: QueueStore,
        streams: TokenStreams,
        engine: AsyncEngine,
        config: DispatcherConfig,
        *,
        redis: aioredis.Redis,
        clock_ms: Callable[[], int] = wall_clock_ms,
        engine_clock_s: Callable[[], float] | None = None,
        on_event: DispatchHook | None = None,
        on_finished: FinishedHook | None = None,
    ) -> None:
        """`on_event` hears every event; `on_finished` only terminal statuses, with timings."""
        self.config = config
        self.counters = DispatchCounters(combine_hooks(on_event, on_finished))
        self._store = store
        self._engine = engine
        self._redis = redis
        self._clock_ms = clock_ms
        self._backoff = Backoff(config.retry_initial_backoff_ms, config.retry_max_backoff_ms)
        # What the held jobs still have to run: admission counts bulk's ahead of a new job.
        self.work = WorkInFlight()
        self._runner = JobRunner(
            store=store,
            streams=streams,
            engine=engine,
            redis=redis,
            clock_ms=clock_ms,
            # The engine stamps its metrics with its own clock; arrival must be on that clock.
            engine_clock_s=engine_clock_s or engine.engine.clock,
            backoff=self._backoff,
            counters=self.counters,
            on_first_token=self._first_token,
            work=self.work,
        )
        self._outcomes = ScriptOutcomes(store, redis, streams, self.counters, self._backoff)
        self._cancels = CancelListener(
            redis, store.keys.cancel_channel, self.cancel_local, self._backoff
        )
        # Keyed by lease token: one job id can be here twice (a lost lease, claimed again).
        self._jobs: dict[int, LocalJob] = {}
        # Slots promised to calls in flight, per class: the claim loop's current claim and
        # the direct starts (`admit_here`), so that neither overfills a class behind the other.
        self._claiming: set[RequestClass] = set()
        self._starting: dict[RequestClass, int] = dict.fromkeys(RequestClass, 0)
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._unmatched_cancels: OrderedDict[str, None] = OrderedDict()
        # Classes this replica serves at all (a limit of 0 turns a class off here).
        self._open_classes = [c for c in RequestClass if config.max_active_by_class[c] > 0]
        # Idle, it waits on the wake-ups of those of them it has room for (`Keys.wake`).
        self._waits = ClaimWaits(store, self._open_classes, config.wait_timeout_s, self._backoff)
        self._claim_task: asyncio.Task[None] | None = None
        self._periodic: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start claiming in the background (start the engine first)."""
        if self._claim_task is not None:
            raise RuntimeError("the dispatcher is already started")
        await self._start_side_loops()
        self._claim_task = asyncio.create_task(self._claim_loop(burst=False), name="claim")

    async def stop(self, drain_timeout_s: float) -> DrainResult:
        """Stop claiming, give local jobs up to `drain_timeout_s`, then hand back the rest.

        NOTE: a job still running at the timeout is aborted here and its lease shortened to
        zero (renew is fenced, so only a lease that is still ours is touched), then a reclaim
        sweep returns it to its queue at its original score at once; an interactive stream
        that already sent tokens is failed with a clear error instead (reclaim's rule). Leaving
        the lease to lapse would be as safe, but the job would wait a whole lease for nothing.
        """
        if drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {drain_timeout_s}")
        self._waits.stopping.set()
        if self._claim_task is not None:
            await self._claim_task
        started = len(self._tasks)
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=drain_timeout_s)
        left = list(self._jobs.values())
        # The lease loop goes first: a renewal landing after the hand-back would stretch the
        # lease again.
        await self._stop_side_loops()
        handed, kept = await self._hand_back([j for j in left if j.abortable])
        await self._let_go()
        return DrainResult(started - len(left), handed, kept)

    async def run_until_idle(self) -> None:
        """Drain-and-return: claim until nothing is claimable, finish local jobs, return."""
        if self._claim_task is not None:
            raise RuntimeError("the dispatcher is already started")
        await self._start_side_loops()
        try:
            await self._claim_loop(burst=True)
            while self._tasks:
                await asyncio.wait(list(self._tasks.values()))
        finally:
            await self._stop_side_loops()

    def in_flight(self) -> dict[RequestClass, int]:
        """Local jobs per class (running, or writing their result)."""
        counts = dict.fromkeys(RequestClass, 0)
        for local in self._jobs.values():
            counts[local.request_class] += 1
        return counts

    # -- claiming ----------------------------------------------------------------------------

    async def _claim_loop(self, *, burst: bool) -> None:
        delays = self._backoff.delays_s()
        try:
            while not self._waits.stopping.is_set():
                if not self._engine.is_running:
                    log.error("engine_not_running_claiming_stopped")
                    return
                # Before counting slots, with no await in between: see ClaimWaits.slot_freed.
                self._waits.slot_freed.clear()
                classes = self._classes_with_room()
                if classes:
                    try:
                        found = await self._claim_one(classes)
                    except Exception:  # Redis down or a bad reply must not end claiming
                        log.warning("claim_failed", exc_info=True)
                        await self._waits.sleep(next(delays))
                        continue
                    delays = self._backoff.delays_s()
                    if found:
                        continue
                some_full = len(classes) < len(self._open_classes)
                if burst and not (some_full and self._jobs):
                    return
                # NOTE: with one class full, a freed slot may make queued work claimable that
                # no wake-up will announce (its admit woke us already), so both are awaited.
                await self._waits.wait(work=() if burst else classes, slot=some_full)
        finally:
            await self._waits.close()

    def unstarted_bulk(self) -> int:
        """Local bulk jobs the engine has given no token yet (queued in it, or mid-prefill)."""
        return sum(
            1
            for local in self._jobs.values()
            if local.request_class is RequestClass.BULK and not local.made_tokens
        )

    def _first_token(self, local: LocalJob) -> None:
        # A bulk job's prompt is done: room for another under the pacing limit. The claim loop
        # clears the event before it counts, so this is never missed.
        if local.request_class is RequestClass.BULK:
            self._waits.slot_freed.set()

    def _paced(self, cls: RequestClass, promised: int) -> bool:
        """Whether `cls` waits for its unstarted jobs (`max_unstarted_bulk_jobs`), counting
        `promised` starts under way."""
        limit = self.config.max_unstarted_bulk_jobs
        if cls is not RequestClass.BULK or limit is None:
            return False
        return self.unstarted_bulk() + promised >= limit

    def _classes_with_room(self) -> list[RequestClass]:
        in_flight = self.in_flight()
        limits = self.config.max_active_by_class
        return [
            c
            for c in self._open_classes
            if in_flight[c] + self._starting[c] < limits[c]
            and not self._paced(c, self._starting[c])
        ]

    async def admit_here(self, job: NewJob) -> AdmitResult:
        """Admit `job`, and start it on this replica at once when its class has a free slot
        here and nothing of its class is queued; otherwise queue it as `QueueStore.admit`.

        NOTE: a started job costs one script call (no queue entry, no wake-up, no claim, no
        claim reply to parse), and the job task is created before this returns, so its route
        is decided before the caller's handler reads anything (no stream read for a chat
        whose client is here). Only for jobs whose id the gateway generated.
        """
        cls = job.request_class
        if self._can_start(cls):
            self._starting[cls] += 1
            try:
                cfg = self.config
                claimed = await self._store.start(
                    job, self._clock_ms(), cfg.lease_ms, cfg.replica_id
                )
            finally:
                self._starting[cls] -= 1
            if claimed is not None:
                self._launch(claimed, started_here=True)
                return AdmitResult(status=AdmitStatus.ADMITTED, depth=0, started=True)
        return await self._store.admit(job)

    def _can_start(self, cls: RequestClass) -> bool:
        if self._claim_task is None or self._waits.stopping.is_set():
            return False  # not serving (drain-and-return mode, or stopping)
        if not self._engine.is_running or cls not in self._open_classes:
            return False
        promised = self._starting[cls] + (1 if cls in self._claiming else 0)
        busy = self.in_flight()[cls] + promised
        return busy < self.config.max_active_by_class[cls] and not self._paced(cls, promised)

    async def _claim_one(self, classes: Sequence[RequestClass]) -> bool:
        """One claim; True when claiming again may find more (it leased a job and its queues
        are not empty yet, or it dropped expired ones). NOTE: False after a claim that emptied
        the asked queues: the next job's admit touches the wake-up key, so waiting on it
        replaces a claim that would find nothing."""
        cfg = self.config
        self._claiming.update(classes)
        try:
            result = await self._store.claim(
                classes, self._clock_ms(), cfg.lease_ms, cfg.replica_id, cfg.class_offsets_ms
            )
        finally:
            self._claiming.clear()
        if result.claimed is not None:
            self._launch(result.claimed)
        if result.expired_ids:
            await self._outcomes.expired(result.expired_ids)
        return (result.claimed is not None and result.more) or bool(result.expired_ids)

    def _launch(self, claimed: ClaimedJob, *, started_here: bool = False) -> None:
        local = LocalJob(claimed, started_here=started_here)
        if local.job_id in self._unmatched_cancels:
            del self._unmatched_cancels[local.job_id]
            local.cancel_requested = True
        self._jobs[local.token] = local
        # Its split is known once its task parses the request (JobRunner._request).
        self.work.start(local.token, local.request_class, claimed.job.cost_tokens, 0)
        self._tasks[local.token] = asyncio.create_task(self._run(local), name=local.job_id)
        self._record(DispatchEventKind.CLAIMED, local)

    async def _run(self, local: LocalJob) -> None:
        try:
            # NOTE: a cancel that raced the claim (its message may have come before the job was
            # local, but its flag was set before the message was sent) is in the claim's reply:
            # the claim script reads the flag (LocalJob takes it from the ClaimedJob).
            await self._runner.run(local)
        except Exception:
            # The lease is left to lapse: a reclaim sweep returns the job to its queue.
            log.exception("job_task_failed", job_id=local.job_id, token=local.token)
        finally:
            self._jobs.pop(local.token, None)
            self._tasks.pop(local.token, None)
            self.work.end(local.token)
            self._waits.slot_freed.set()

    # -- leases ------------------------------------------------------------------------------

    async def renew_leases(self) -> None:
        """One round of the lease loop: renew every local lease, then look for missed cancels."""
        jobs = [j for j in self._jobs.values() if not j.stopping]
        if not jobs:
            return
        now_ms, lease_ms = self._clock_ms(), self.config.lease_ms
        renewed = await asyncio.gather(
            *(self._store.renew(j.job_id, j.token, now_ms, lease_ms) for j in jobs),
            return_exceptions=True,
        )
        for local, ok in zip(jobs, renewed, strict=True):
            if isinstance(ok, BaseException):
                # The next round tries again; a lease outlives one failed renewal.
                log.warning("renew_failed", job_id=local.job_id, error=repr(ok))
            elif not ok and local.abortable:
                # Reclaimed (this replica stalled past its lease): someone else may run it now.
                log.warning("lease_lost", job_id=local.job_id, token=local.token)
                local.fenced = True
                self._engine.abort(local.engine_request_id)
        # NOTE: pub/sub is at-most-once (a message sent while the listener reconnects is lost),
        # so the flags are read here as well: a missed cancel lands within one renew interval.
        running = [j for j in jobs if j.abortable]
        flags = await cancel_flags_set(self._redis, self._store.keys, [j.job_id for j in running])
        for local, flagged in zip(running, flags, strict=True):
            if flagged:
                self._cancel(local)

    async def reclaim_lapsed(self) -> ReclaimResult:
        """One sweep: lapsed leases (of any replica) back to their queue, or finished."""
        return await self._outcomes.reclaim(self._clock_ms(), self.config.reclaim_batch)

    async def _hand_back(self, jobs: list[LocalJob]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        handed: list[str] = []
        kept: list[str] = []
        for local in jobs:
            local.handed_back = True
            self._engine.abort(local.engine_request_id)
        for local in jobs:
            try:
                # A zero lease has lapsed by now; the renew is fenced by our token.
                ok = await self._store.renew(local.job_id, local.token, self._clock_ms(), 0)
            except Exception:
                log.warning("hand_back_failed", job_id=local.job_id, exc_info=True)
                ok = False
            (handed if ok else kept).append(local.job_id)
            if ok:
                self._record(DispatchEventKind.HANDED_BACK, local)
        if handed:
            try:
                await self.reclaim_lapsed()
            except Exception:  # any replica's next sweep finds the lapsed leases
                log.warning("hand_back_reclaim_failed", exc_info=True)
        return tuple(handed), tuple(kept)

    async def _let_go(self) -> None:
        """Wait briefly for job tasks to end (aborted ones end at once), cancel the rest."""
        tasks = list(self._tasks.values())
        if not tasks:
            return
        _, stuck = await asyncio.wait(tasks, timeout=self.config.hand_back_grace_s)
        for task in stuck:
            # Still writing its result (Redis down?): its lease lapses and reclaim retries it.
            log.warning("job_task_cancelled_at_stop", job_id=task.get_name())
        # Bounded: a task that swallows its cancel must not hold the shutdown (bounded_cancel).
        await cancel_and_wait(tasks)

    # -- cancellation ------------------------------------------------------------------------

    def cancel_local(self, job_id: str) -> bool:
        """Abort a local job now (it completes as cancelled); False when none runs here."""
        found = False
        for local in list(self._jobs.values()):
            if local.job_id == job_id and local.abortable:
                self._cancel(local)
                found = True
        if not found:
            self._unmatched_cancels[job_id] = None
            while len(self._unmatched_cancels) > _UNMATCHED_CANCELS_KEPT:
                self._unmatched_cancels.popitem(last=False)
        return found

    def _cancel(self, local: LocalJob) -> None:
        log.info("cancelling", job_id=local.job_id, token=local.token)
        local.cancel_requested = True
        # At once rather than at the next delta: a job waiting in the engine has no next
        # delta, and the abort frees its KV blocks.
        self._engine.abort(local.engine_request_id)

    # -- background loops --------------------------------------------------------------------

    async def _start_side_loops(self) -> None:
        if not self._engine.is_running:
            raise RuntimeError("start the engine before the dispatcher")
        self._waits.stopping.clear()
        await self._cancels.start()
        cfg = self.config
        self._periodic = [
            asyncio.create_task(self._every(cfg.renew_interval_ms, self.renew_leases)),
            asyncio.create_task(self._every(cfg.reclaim_interval_ms, self.reclaim_lapsed)),
        ]

    async def _stop_side_loops(self) -> None:
        await cancel_and_wait(self._periodic)
        self._periodic = []
        await self._cancels.stop()

    async def _every(self, interval_ms: int, tick: Callable[[], Awaitable[Any]]) -> None:
        while True:
            try:
                await tick()
            except Exception:  # one failed round must not end the loop; the next one retries
                log.warning("periodic_task_failed", task=tick.__name__, exc_info=True)
            await asyncio.sleep(interval_ms / 1000.0)

    def _record(self, kind: DispatchEventKind, local: LocalJob) -> None:
        self.counters.record(DispatchEvent(kind, local.request_class, local.job_id))
