"""Every Redis key and channel name of the queue layer, in one place.

All names share one prefix that carries a Redis Cluster hash tag (`{mixgate}` by default), so
every key lands on the same slot and the Lua scripts may touch any of them atomically.

NOTE: the scripts also build a few names themselves from the prefix (passed in ARGV), because
they only learn a job id or a job's class after reading Redis: `prefix .. 'job:' .. id`,
`'pending:' .. class`, `'queued_tokens:' .. class`, `'wake:' .. class`, `'cancel:' .. id`.
Redis Cluster accepts those because the hash tag keeps them on the slot of the declared KEYS.
Renaming one here means renaming it in `scripts/*.lua` too; the store tests read those keys back
through this class.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.request_class import RequestClass

DEFAULT_PREFIX = "{mixgate}:"


def _has_hash_tag(prefix: str) -> bool:
    # Redis hashes only what lies between the first "{" and the first "}" after it, and only
    # when that is non-empty; otherwise the whole key is hashed and keys scatter over slots.
    start = prefix.find("{")
    if start < 0:
        return False
    end = prefix.find("}", start + 1)
    return end > start + 1


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one hash-tagged prefix. Tests pass a random prefix to share a server."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not _has_hash_tag(self.prefix):
            raise ValueError(
                f"key prefix {self.prefix!r} needs a non-empty {{hash tag}} so that all queue "
                "keys live on one Redis Cluster slot"
            )

    def pending(self, request_class: RequestClass) -> str:
        """ZSET of queued job ids scored by enqueue time (ms)."""
        return f"{self.prefix}pending:{request_class.value}"

    def job(self, job_id: str) -> str:
        """HASH with the job's fields (see `gateway.queue.job.JobRecord`)."""
        return f"{self.prefix}job:{job_id}"

    @property
    def inflight(self) -> str:
        """ZSET of running job ids scored by lease expiry (ms)."""
        return f"{self.prefix}inflight"

    @property
    def fence(self) -> str:
        """INCR counter handing out fencing tokens, one per claim."""
        return f"{self.prefix}fence"

    def wake(self, request_class: RequestClass) -> str:
        """Bounded ZSET of one class that admit and reclaim touch; an idle dispatcher BZPOPMINs
        on the ones of the classes it has free slots for, so a replica that does not run a
        class (or has no room for it) neither wakes for its work nor keeps a wake-up meant for
        a replica that could run it (`gateway.queue.wake_ups`)."""
        return f"{self.prefix}wake:{request_class.value}"

    def queued_tokens(self, request_class: RequestClass) -> str:
        """Counter of queued work in tokens (prompt + max_tokens), for admission's wait estimate."""
        return f"{self.prefix}queued_tokens:{request_class.value}"

    def tenant_jobs(self, tenant: str) -> str:
        """ZSET of a tenant's job ids scored by creation time (ms), for listing."""
        return f"{self.prefix}tenant_jobs:{tenant}"

    def out(self, job_id: str) -> str:
        """Stream of token deltas of one job (written by the dispatcher, read by SSE/jobs)."""
        return f"{self.prefix}out:{job_id}"

    def cancel(self, job_id: str) -> str:
        """Flag (with a TTL) that a running job was asked to stop."""
        return f"{self.prefix}cancel:{job_id}"

    @property
    def cancel_channel(self) -> str:
        """Pub/sub channel that carries the ids of running jobs to cancel."""
        return f"{self.prefix}cancels"
