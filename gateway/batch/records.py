"""A batch as stored in its Redis hash, and as OpenAI's API shows it (`openai.types.Batch`).

Lifecycle (OpenAI's statuses): ``validating`` (created; the supervisor has not picked it up)
-> ``in_progress`` (lines are fed to the bulk queue and recorded as they finish) ->
``finalizing`` (writing the output and error files) -> ``completed``. Or ``failed`` (no valid
line), ``expired`` (the window passed: finished lines kept, the rest are ``batch_expired``
error lines), ``cancelling`` -> ``cancelled`` (finished lines kept, the rest are
``batch_cancelled`` error lines).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.queue.redis_text import redis_text

__all__ = ["TIMESTAMP_FIELDS", "BatchRecord", "BatchStatus", "StopReason", "batch_object"]


class BatchStatus(StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (
            BatchStatus.FAILED,
            BatchStatus.COMPLETED,
            BatchStatus.EXPIRED,
            BatchStatus.CANCELLED,
        )


class StopReason(StrEnum):
    """Why the lines still to run will not run (stored as the hash's `stop` field)."""

    NONE = ""
    CANCELLED = "cancelled"
    EXPIRED = "expired"


# Unix seconds; 0 in the hash means "not yet".
TIMESTAMP_FIELDS = (
    "created_at",
    "in_progress_at",
    "expires_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


@dataclass(frozen=True, slots=True)
class BatchRecord:
    batch_id: str
    tenant: str
    status: BatchStatus
    stop: StopReason
    endpoint: str
    input_file_id: str
    completion_window: str
    model: str
    metadata: dict[str, str]
    # Timestamp field name -> Unix seconds, or None.
    times_s: dict[str, int | None]
    total: int
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    # OpenAI's `errors.data`: the malformed lines found at creation (capped).
    errors: list[dict[str, Any]]

    @property
    def expires_at_s(self) -> int:
        expires = self.times_s["expires_at"]
        assert expires is not None
        return expires

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> BatchRecord:
        h = {redis_text(k): redis_text(v) for k, v in raw.items()}
        times: dict[str, int | None] = {}
        for name in TIMESTAMP_FIELDS:
            value = int(h.get(name) or 0)
            times[name] = value if value > 0 else None
        return cls(
            batch_id=h["id"],
            tenant=h["tenant"],
            status=BatchStatus(h["status"]),
            stop=StopReason(h.get("stop", "")),
            endpoint=h["endpoint"],
            input_file_id=h["input_file_id"],
            completion_window=h["completion_window"],
            model=h.get("model", ""),
            metadata=json.loads(h.get("metadata") or "{}"),
            times_s=times,
            total=int(h.get("total") or 0),
            completed=int(h.get("completed") or 0),
            failed=int(h.get("failed") or 0),
            output_file_id=h.get("output_file_id") or None,
            error_file_id=h.get("error_file_id") or None,
            errors=json.loads(h.get("errors") or "[]"),
        )


def batch_object(record: BatchRecord) -> dict[str, Any]:
    """The batch as OpenAI's API shows it; every field `openai.types.Batch` reads."""
    body: dict[str, Any] = {
        "id": record.batch_id,
        "object": "batch",
        "endpoint": record.endpoint,
        "model": record.model or None,
        "errors": {"object": "list", "data": record.errors} if record.errors else None,
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": record.status.value,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
    }
    body.update(record.times_s)
    body["request_counts"] = {
        "total": record.total,
        "completed": record.completed,
        "failed": record.failed,
    }
    body["metadata"] = record.metadata or None
    body["usage"] = None
    return body
