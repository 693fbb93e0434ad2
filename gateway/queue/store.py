"""`QueueStore`: the gateway's job queue in Redis, one method per atomic Lua script.

The store is deliberately thin: every state change is one script (`scripts/*.lua`), so it is
atomic across replicas, and every policy decision (is the deadline feasible, how long a lease
is, which classes have free slots, what the aging offsets are) is the caller's, passed in.
Clocks are passed in too (`now_ms`), never read here or in Lua, so tests control time.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from gateway.queue.coalescer import Coalescer
from gateway.queue.job import (
    COMPLETION_STATUSES,
    STATUS_FIELDS,
    JobRecord,
    JobStatus,
    JobStatusView,
    NewJob,
)
from gateway.queue.keys import Keys
from gateway.queue.redis_text import redis_text
from gateway.queue.results import (
    AdmitResult,
    AdmitStatus,
    ClaimedJob,
    ClaimResult,
    QueueDepth,
    ReclaimResult,
)
from gateway.queue.wake_ups import WakeUps
from policies.request_class import RequestClass

# What redis-py accepts as a script argument.
_Arg = str | int

# Jobs read by one call of statuses.lua (a slice of a larger read).
STATUS_READS_PER_SCRIPT = 512

# A started job's first lease token, drawn here rather than from the fence counter (start.lua):
# above any count of claims the counter will reach. The scripts keep tokens as strings and
# compare them for equality; the bound below 2^53 keeps one exact for any reader that parses it
# as a double (Lua's tonumber, a JSON client).
FIRST_LEASE_TOKEN_MIN = 1 << 52
FIRST_LEASE_TOKEN_MAX = (1 << 53) - 1


def first_lease_token() -> int:
    """Uniform over [FIRST_LEASE_TOKEN_MIN, FIRST_LEASE_TOKEN_MAX]."""
    return FIRST_LEASE_TOKEN_MIN + secrets.randbelow(
        FIRST_LEASE_TOKEN_MAX - FIRST_LEASE_TOKEN_MIN + 1
    )


_SCRIPTS = (
    "admit",
    "start",
    "claim",
    "renew",
    "complete",
    "reclaim",
    "cancel",
    "mark_tokens_sent",
    "list_page",
    "resume",
    "statuses",
)


def _load_script(name: str) -> str:
    # importlib.resources finds the files inside an installed wheel as well as in a checkout.
    return resources.files("gateway.queue").joinpath("scripts", f"{name}.lua").read_text()


def _ids(values: Sequence[Any]) -> tuple[str, ...]:
    return tuple(redis_text(v) for v in values)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    # Lua scripts run with RESP2, so HGETALL inside a script comes back as a flat list.
    return {redis_text(flat[i]): redis_text(flat[i + 1]) for i in range(0, len(flat), 2)}


class QueueStore:
    """Per-class pending queues, leases with fencing tokens, cancellation and job records."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys | None = None,
        *,
        cancel_flag_ttl_ms: int = 3_600_000,
        wake_max: int = 256,
        claim_scan_max: int = 64,
    ) -> None:
        if cancel_flag_ttl_ms < 1:
            raise ValueError(f"cancel_flag_ttl_ms must be >= 1, got {cancel_flag_ttl_ms}")
        if wake_max < 1:
            raise ValueError(f"wake_max must be >= 1, got {wake_max}")
        if claim_scan_max < 1:
            raise ValueError(f"claim_scan_max must be >= 1, got {claim_scan_max}")
        self._redis = redis
        self.keys = keys if keys is not None else Keys()
        # Long enough to outlive any lease: reclaim reads the flag to cancel instead of retry.
        self._cancel_flag_ttl_ms = cancel_flag_ttl_ms
        # How many wake-up markers may pile up while no dispatcher is idle.
        self._wake_max = wake_max
        # How many queue heads one claim may drop (expired) before it returns to the caller.
        self._claim_scan_max = claim_scan_max
        self._status_reads: Coalescer[str, JobStatusView | None] = Coalescer(self.job_statuses)
        # What an idle claim loop blocks on (admit and reclaim write the markers).
        self.wake_ups = WakeUps(redis, self.keys)
        self._scripts: dict[str, AsyncScript] = {
            name: redis.register_script(_load_script(name)) for name in _SCRIPTS
        }

    async def admit(self, job: NewJob) -> AdmitResult:
        """Enqueue unless the id exists or the class queue is at `job.queue_limit`."""
        (result,) = await self.admit_many([job])
        return result

    async def admit_many(
        self, jobs: Sequence[NewJob], listing_key: str | None = None
    ) -> list[AdmitResult]:
        """Admit each job in order, as many lone `admit` calls would, in one script call.

        `listing_key`: the sorted set that lists the jobs (default: each job's tenant's
        listing; the Batch API lists a batch's jobs under the batch instead).
        """
        if not jobs:
            return []
        k = self.keys
        keys: list[str] = []
        args: list[_Arg] = [self._wake_max]
        for job in jobs:
            keys += [
                k.job(job.job_id),
                k.pending(job.request_class),
                k.queued_tokens(job.request_class),
                k.tenant_jobs(job.tenant) if listing_key is None else listing_key,
                k.wake(job.request_class),
            ]
            args += job.admit_args()
        flat = await self._scripts["admit"](keys=keys, args=args)
        return [
            AdmitResult(status=AdmitStatus(redis_text(flat[i])), depth=int(flat[i + 1]))
            for i in range(0, len(flat), 2)
        ]

    async def start(
        self, job: NewJob, now_ms: int, lease_ms: int, replica_id: str
    ) -> ClaimedJob | None:
        """Admit `job` straight into running under `replica_id`'s lease (what admit and then
        this replica's claim would do, in one step); None, with nothing written, when a job of
        its class is queued (starting would overtake it), its class queue is closed or its
        deadline passed: admit it to the queue then.

        Only for a job whose id the gateway generated (the script skips the duplicate check).
        """
        if lease_ms < 1:
            raise ValueError(f"lease_ms must be >= 1, got {lease_ms}")
        if not replica_id:
            raise ValueError("replica_id must be non-empty")
        k = self.keys
        keys = [
            k.job(job.job_id),
            k.pending(job.request_class),
            k.inflight,
            k.tenant_jobs(job.tenant),
        ]
        args: list[_Arg] = [*job.admit_args(), now_ms, lease_ms, replica_id, first_lease_token()]
        token, expiry_ms = await self._scripts["start"](keys=keys, args=args)
        if int(token) == 0:
            return None
        record = JobRecord(
            job_id=job.job_id,
            tenant=job.tenant,
            request_class=job.request_class,
            status=JobStatus.RUNNING,
            request_json=job.request_json,
            enqueue_ms=job.enqueue_ms,
            deadline_ms=job.deadline_ms,
            cost_tokens=job.cost_tokens,
            attempts=1,
            max_attempts=job.max_attempts,
            lease_token=int(token),
            replica=replica_id,
            started_ms=now_ms if now_ms > 0 else None,
            finished_ms=None,
            result_json=None,
            error_json=None,
            tokens_sent=False,
            custom_id=job.custom_id,
            metadata_json=job.metadata_json,
        )
        return ClaimedJob(job=record, lease_token=int(token), lease_expiry_ms=int(expiry_ms))

    async def claim(
        self,
        classes: Sequence[RequestClass],
        now_ms: int,
        lease_ms: int,
        replica_id: str,
        class_offsets_ms: Mapping[RequestClass, int],
    ) -> ClaimResult:
        """Lease the oldest job by aged score among `classes` (those with free slots)."""
        if lease_ms < 1:
            raise ValueError(f"lease_ms must be >= 1, got {lease_ms}")
        if not replica_id:
            raise ValueError("replica_id must be non-empty")
        # Enum order makes ties deterministic: interactive wins an exact tie with bulk.
        asked = [c for c in RequestClass if c in classes]
        if not asked:
            return ClaimResult(claimed=None)
        missing = [c.value for c in asked if c not in class_offsets_ms]
        if missing:
            raise ValueError(f"class_offsets_ms has no offset for {missing}")
        keys = [self.keys.inflight, self.keys.fence]
        args: list[_Arg] = [
            self.keys.prefix,
            now_ms,
            lease_ms,
            replica_id,
            self._claim_scan_max,
        ]
        for c in asked:
            keys += [self.keys.pending(c), self.keys.queued_tokens(c), self.keys.wake(c)]
            args += [c.value, class_offsets_ms[c]]
        job_id, token, expiry_ms, fields, expired, cancel_flag, more = await self._scripts["claim"](
            keys=keys, args=args
        )
        claimed = None
        if redis_text(job_id):
            claimed = ClaimedJob(
                job=JobRecord.from_hash(_pairs(fields)),
                lease_token=int(token),
                lease_expiry_ms=int(expiry_ms),
                cancel_requested=int(cancel_flag) == 1,
            )
        return ClaimResult(claimed=claimed, expired_ids=_ids(expired), more=int(more) == 1)

    async def renew(self, job_id: str, token: int, now_ms: int, lease_ms: int) -> bool:
        """Extend the lease to now_ms + lease_ms; False means stop: the job is not ours."""
        keys = [self.keys.job(job_id), self.keys.inflight]
        reply = await self._scripts["renew"](keys=keys, args=[job_id, token, now_ms, lease_ms])
        return redis_text(reply) == "ok"

    async def complete(
        self,
        job_id: str,
        token: int,
        status: JobStatus,
        result_json: str | None,
        error_json: str | None,
        now_ms: int,
        last_event: tuple[str, str] | None = None,
        stream_ttl_s: int = 3600,
    ) -> bool:
        """Finish a job we hold; False when the lease is no longer ours (nothing written).

        `last_event` (kind, data JSON) is appended to the job's token stream, with its expiry,
        in the same atomic step: only an attempt whose outcome counts ends the stream.
        """
        if status not in COMPLETION_STATUSES:
            raise ValueError(f"a job is completed as one of {sorted(COMPLETION_STATUSES)}")
        if stream_ttl_s < 1:
            raise ValueError(f"stream_ttl_s must be >= 1, got {stream_ttl_s}")
        k = self.keys
        keys = [k.job(job_id), k.inflight, k.cancel(job_id), k.out(job_id)]
        event_kind, event_data = last_event if last_event is not None else ("", "")
        args: list[_Arg] = [
            job_id,
            token,
            status.value,
            result_json or "",
            error_json or "",
            now_ms,
            event_kind,
            event_data,
            stream_ttl_s,
        ]
        reply = await self._scripts["complete"](keys=keys, args=args)
        return redis_text(reply) == "ok"

    async def reclaim(self, now_ms: int, limit: int = 100) -> ReclaimResult:
        """Deal with up to `limit` lapsed leases (any replica may run this sweep)."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        keys = [self.keys.inflight]
        args: list[_Arg] = [self.keys.prefix, now_ms, limit, self._wake_max]
        requeued, failed, cancelled = await self._scripts["reclaim"](keys=keys, args=args)
        return ReclaimResult(
            requeued_ids=_ids(requeued), failed_ids=_ids(failed), cancelled_ids=_ids(cancelled)
        )

    async def cancel(
        self, job_id: str, tenant: str, now_ms: int, *, reader_epoch: int | None = None
    ) -> str:
        """'cancelled' | 'cancelling' | the terminal status it already had | 'not_found';
        with `reader_epoch` (an abandoned stream's grace timer), 'resumed' and nothing done
        when a resume has bumped the job's epoch past it (`resume_reader`)."""
        keys = [self.keys.job(job_id), self.keys.cancel(job_id)]
        args: list[_Arg] = [
            job_id,
            tenant,
            now_ms,
            self._cancel_flag_ttl_ms,
            self.keys.prefix,
            self.keys.cancel_channel,
            "" if reader_epoch is None else reader_epoch,
        ]
        return redis_text(await self._scripts["cancel"](keys=keys, args=args))

    async def resume_reader(self, job_id: str, tenant: str) -> int | None:
        """A new reader of the job's stream: its reader epoch (from 1); None when the job is
        unknown or another tenant's. A job nobody resumed has epoch 0."""
        epoch = int(await self._scripts["resume"](keys=[self.keys.job(job_id)], args=[tenant]))
        return None if epoch < 0 else epoch

    async def get_job(self, job_id: str, tenant: str) -> JobRecord | None:
        """The job, or None when it is unknown or belongs to another tenant."""
        raw = await self._redis.hgetall(self.keys.job(job_id))
        if not raw:
            return None
        job = JobRecord.from_hash(raw)
        return job if job.tenant == tenant else None

    async def get_job_status(self, job_id: str, tenant: str) -> JobStatusView | None:
        """What a status answer reports, without reading the request payload (one HMGET,
        pipelined with the other status reads of the same moment)."""
        view = await self._status_reads.call(job_id)
        if view is None or view.tenant != tenant:
            return None
        return await self._with_model_from_request(view)

    async def job_statuses(self, job_ids: Sequence[str]) -> list[JobStatusView | None]:
        """The status fields of each job (None: unknown): one script call per 512 jobs."""
        keys = [self.keys.job(job_id) for job_id in job_ids]
        fields = list(STATUS_FIELDS)
        views: list[JobStatusView | None] = []
        # A batch's supervisor reads thousands at once: in slices, so that no one script call
        # holds Redis for long.
        for first in range(0, len(keys), STATUS_READS_PER_SCRIPT):
            part = keys[first : first + STATUS_READS_PER_SCRIPT]
            rows = await self._scripts["statuses"](keys=part, args=fields)
            views.extend(JobStatusView.from_values(values) for values in rows)
        return views

    async def _with_model_from_request(self, view: JobStatusView) -> JobStatusView:
        # A job admitted before `model`/`created_s` were stored: read them from its request.
        if view.model:
            return view
        request_json = await self._redis.hget(self.keys.job(view.job_id), "request")
        request = json.loads(redis_text(request_json)) if request_json else {}
        return replace(
            view,
            model=str(request.get("model", "")),
            created_s=int(request.get("created_s", view.created_s)),
        )

    async def list_jobs(self, tenant: str, limit: int, after: str | None) -> list[JobStatusView]:
        """The tenant's jobs, newest first, as their status fields (never the request: a poller
        that pages through a backlog of long prompts would otherwise read and parse every
        prompt on each poll); pass the last id of a page as `after` for the next."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        ids = await self._scripts["list_page"](
            keys=[self.keys.tenant_jobs(tenant)], args=[after or "", limit]
        )
        if not ids:
            return []
        views = await self.job_statuses([redis_text(job_id) for job_id in ids])
        # A hash may be gone (retention) while the listing entry remains: skip it.
        return [await self._with_model_from_request(view) for view in views if view is not None]

    async def depths(self) -> dict[RequestClass, QueueDepth]:
        """Jobs and queued tokens per class, read in one round trip."""
        pipe = self._redis.pipeline(transaction=False)
        for c in RequestClass:
            pipe.zcard(self.keys.pending(c))
            pipe.get(self.keys.queued_tokens(c))
        replies = await pipe.execute()
        return {
            c: QueueDepth(jobs=int(replies[2 * i]), queued_tokens=int(replies[2 * i + 1] or 0))
            for i, c in enumerate(RequestClass)
        }

    async def mark_tokens_sent(self, job_id: str) -> bool:
        """Record the first streamed token; False when the job does not exist."""
        reply = await self._scripts["mark_tokens_sent"](keys=[self.keys.job(job_id)])
        return int(reply) == 1
