"""A queued job: its statuses, what the gateway submits, and what Redis holds about it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.queue.redis_text import redis_text
from policies.request_class import RequestClass


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its deadline passed while it waited: dropped at claim time, never run.
    EXPIRED = "expired"

    @property
    def terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


# The statuses a lease holder may finish a job with (expired is only set by claim).
COMPLETION_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class NewJob:
    """What admission hands to `QueueStore.admit`; the decision to admit is already made."""

    job_id: str
    tenant: str
    request_class: RequestClass
    # The request as JSON; opaque to Redis and to this layer.
    request_json: str
    enqueue_ms: int
    # Prompt tokens + max_tokens: what the job adds to `queued_tokens:{class}`.
    cost_tokens: int
    # The class queue's length bound from the current envelope, checked atomically with the
    # enqueue (a separate ZCARD would race with other replicas).
    queue_limit: int
    deadline_ms: int | None = None
    max_attempts: int = 3
    custom_id: str | None = None
    metadata_json: str = "{}"
    # Echoed by status reads, stored beside the request so that a poll never parses it.
    model: str = ""
    # Wall-clock seconds the gateway received it (OpenAI's `created`).
    created_s: int = 0

    def admit_args(self) -> list[str | int]:
        """This job's 13 ARGV fields of admit.lua, in the script's order (one place for both
        callers: chat/job intake and the batch feed)."""
        return [
            self.job_id,
            self.tenant,
            self.request_class.value,
            self.request_json,
            self.enqueue_ms,
            self.deadline_ms or 0,
            self.cost_tokens,
            self.max_attempts,
            self.custom_id or "",
            self.metadata_json,
            self.queue_limit,
            self.model,
            self.created_s,
        ]

    def __post_init__(self) -> None:
        if not self.job_id or any(ch.isspace() for ch in self.job_id):
            raise ValueError(f"job_id must be non-empty without whitespace, got {self.job_id!r}")
        if not self.tenant:
            raise ValueError("tenant must be non-empty")
        if self.enqueue_ms < 0:
            raise ValueError(f"enqueue_ms must be >= 0, got {self.enqueue_ms}")
        if self.cost_tokens < 0:
            raise ValueError(f"cost_tokens must be >= 0, got {self.cost_tokens}")
        if self.queue_limit < 0:
            raise ValueError(f"queue_limit must be >= 0, got {self.queue_limit}")
        # 0 means "no deadline" inside Redis, so a real deadline must be positive.
        if self.deadline_ms is not None and self.deadline_ms <= 0:
            raise ValueError(f"deadline_ms must be > 0 or None, got {self.deadline_ms}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")


def _optional_ms(value: str) -> int | None:
    # The hash stores 0 for "not yet" / "none" so that Lua can compare numbers without nil checks.
    ms = int(value)
    return ms if ms > 0 else None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored in `job:{id}`, with typed fields."""

    job_id: str
    tenant: str
    request_class: RequestClass
    status: JobStatus
    request_json: str
    enqueue_ms: int
    deadline_ms: int | None
    cost_tokens: int
    # Claims so far; a reclaimed lease counts as a spent attempt.
    attempts: int
    max_attempts: int
    # The fencing token of the current (or last) lease; None while it waits.
    lease_token: int | None
    # The replica that holds (or last held) the lease.
    replica: str | None
    # The first claim; kept across retries so "time since start" covers every attempt.
    started_ms: int | None
    finished_ms: int | None
    result_json: str | None
    error_json: str | None
    # An interactive stream that already sent a token is not retried after its lease lapses.
    tokens_sent: bool
    custom_id: str | None
    metadata_json: str

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> JobRecord:
        """Parse HGETALL output (decoded or not); raises KeyError/ValueError on a corrupt hash."""
        h = {redis_text(k): redis_text(v) for k, v in raw.items()}
        lease_token = h["lease_token"]
        return cls(
            job_id=h["id"],
            tenant=h["tenant"],
            request_class=RequestClass(h["class"]),
            status=JobStatus(h["status"]),
            request_json=h["request"],
            enqueue_ms=int(h["enqueue_ms"]),
            deadline_ms=_optional_ms(h["deadline_ms"]),
            cost_tokens=int(h["cost_tokens"]),
            attempts=int(h["attempts"]),
            max_attempts=int(h["max_attempts"]),
            lease_token=int(lease_token) if lease_token else None,
            replica=h["replica"] or None,
            started_ms=_optional_ms(h["started_ms"]),
            finished_ms=_optional_ms(h["finished_ms"]),
            result_json=h["result"] or None,
            error_json=h["error"] or None,
            tokens_sent=h["tokens_sent"] == "1",
            custom_id=h["custom_id"] or None,
            metadata_json=h["metadata"],
        )


# What a status read fetches (HMGET): everything the API shows, never the request (the
# tokenized prompt, often the bulk of the hash).
STATUS_FIELDS: tuple[str, ...] = (
    "id",
    "tenant",
    "class",
    "status",
    "model",
    "created_s",
    "enqueue_ms",
    "deadline_ms",
    "started_ms",
    "finished_ms",
    "attempts",
    "custom_id",
    "metadata",
    "result",
    "error",
)


@dataclass(frozen=True, slots=True)
class JobStatusView:
    """The fields of `job:{id}` a status answer reports, read without the request payload."""

    job_id: str
    tenant: str
    request_class: RequestClass
    status: JobStatus
    model: str
    created_s: int
    enqueue_ms: int
    deadline_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    attempts: int
    custom_id: str | None
    metadata_json: str
    result_json: str | None
    error_json: str | None

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> JobStatusView | None:
        """Parse HMGET of STATUS_FIELDS; None when the job does not exist.

        A job admitted before `model`/`created_s` were stored has them empty: its model reads
        as "" here and the caller fills it in from the request (`with_model`).
        """
        v = [redis_text(x) if x is not None else "" for x in values]
        if not v[0]:
            return None
        return cls(
            job_id=v[0],
            tenant=v[1],
            request_class=RequestClass(v[2]),
            status=JobStatus(v[3]),
            model=v[4],
            created_s=int(v[5]) if v[5] else int(v[6]) // 1000,
            enqueue_ms=int(v[6]),
            deadline_ms=_optional_ms(v[7]),
            started_ms=_optional_ms(v[8]),
            finished_ms=_optional_ms(v[9]),
            attempts=int(v[10]),
            custom_id=v[11] or None,
            metadata_json=v[12] or "{}",
            result_json=v[13] or None,
            error_json=v[14] or None,
        )
