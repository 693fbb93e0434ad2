"""The Redis job queue: per-class pending queues, leases with fencing, cancellation."""

from gateway.queue.job import JobRecord, JobStatus, NewJob
from gateway.queue.keys import Keys
from gateway.queue.results import (
    AdmitResult,
    AdmitStatus,
    ClaimedJob,
    ClaimResult,
    QueueDepth,
    ReclaimResult,
)
from gateway.queue.store import QueueStore

__all__ = [
    "AdmitResult",
    "AdmitStatus",
    "ClaimResult",
    "ClaimedJob",
    "JobRecord",
    "JobStatus",
    "Keys",
    "NewJob",
    "QueueDepth",
    "QueueStore",
    "ReclaimResult",
]
