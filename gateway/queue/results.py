"""What the queue store's operations return."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gateway.queue.job import JobRecord


class AdmitStatus(StrEnum):
    ADMITTED = "admitted"
    # A job with this id exists (a client retry): nothing was written.
    DUPLICATE = "duplicate"
    # The class queue is at its length bound: the HTTP layer answers 429 + Retry-After.
    QUEUE_FULL = "queue_full"


@dataclass(frozen=True, slots=True)
class AdmitResult:
    status: AdmitStatus
    # Length of the class queue after the call (including the new job when admitted).
    depth: int
    # Admitted straight into running on this replica (`QueueStore.start`): never queued, so
    # the queue's depth and queued tokens do not count it.
    started: bool = False

    def __post_init__(self) -> None:
        if self.depth < 0:
            raise ValueError(f"depth must be >= 0, got {self.depth}")

    @property
    def admitted(self) -> bool:
        return self.status is AdmitStatus.ADMITTED


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this replica now runs, under a lease it must renew before `lease_expiry_ms`."""

    job: JobRecord
    # Fencing token: renew/complete with any other token are refused, so a replica whose lease
    # was reclaimed cannot overwrite the result of the replica that holds the job now.
    lease_token: int
    lease_expiry_ms: int
    # A cancel was flagged before the claim (it raced it): complete as cancelled, do not run.
    cancel_requested: bool = False

    def __post_init__(self) -> None:
        if self.lease_token < 1:
            raise ValueError(f"lease_token must be >= 1, got {self.lease_token}")


@dataclass(frozen=True, slots=True)
class ClaimResult:
    # None when every asked queue is empty, or when the scan bound was spent on expired jobs
    # (then `expired_ids` is non-empty and the caller should claim again).
    claimed: ClaimedJob | None
    # Jobs dropped because their deadline passed while they waited; the caller tells their
    # streams / pollers. They never appear as claimed.
    expired_ids: tuple[str, ...] = ()
    # An asked queue still holds entries after this call: claim again. False: every asked
    # queue is empty, so the caller may wait for a wake-up instead of a claim that finds
    # nothing (an admit after this call touches the wake-up key).
    more: bool = True


@dataclass(frozen=True, slots=True)
class ReclaimResult:
    """Jobs whose lease lapsed (their replica died or stalled), by what became of them."""

    # Back in pending at their original enqueue score, so they keep their age.
    requeued_ids: tuple[str, ...] = ()
    # Out of attempts, or interactive streams that had already sent tokens.
    failed_ids: tuple[str, ...] = ()
    # A cancel was requested while they ran: finished as cancelled instead of retried.
    cancelled_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """One class queue's backlog, as admission's wait prediction sees it."""

    jobs: int
    # Sum of prompt + max_tokens over the queued jobs.
    queued_tokens: int

    def __post_init__(self) -> None:
        if self.jobs < 0:
            raise ValueError(f"jobs must be >= 0, got {self.jobs}")
