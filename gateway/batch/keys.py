"""Redis key names of the Files and Batch APIs, under the queue's hash-tagged prefix.

They share the queue's prefix (`gateway.queue.Keys.prefix`), so a batch's keys live on the same
Redis Cluster slot as the job keys that the feed and record scripts touch together.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.queue import Keys


@dataclass(frozen=True, slots=True)
class BatchKeys:
    queue: Keys

    @property
    def prefix(self) -> str:
        return self.queue.prefix

    def file(self, file_id: str) -> str:
        """HASH: a file's metadata (its bytes live in the file storage)."""
        return f"{self.prefix}file:{file_id}"

    def tenant_files(self, tenant: str) -> str:
        """ZSET of a tenant's file ids scored by creation time (ms), for listing."""
        return f"{self.prefix}tenant_files:{tenant}"

    def batch(self, batch_id: str) -> str:
        """HASH: a batch's status, timestamps, counts and file ids."""
        return f"{self.prefix}batch:{batch_id}"

    def tenant_batches(self, tenant: str) -> str:
        """ZSET of a tenant's batch ids scored by creation time (ms), for listing."""
        return f"{self.prefix}tenant_batches:{tenant}"

    @property
    def active(self) -> str:
        """SET of batch ids the supervisors still have work on (not terminal, or not cleaned)."""
        return f"{self.prefix}batches_active"

    def lock(self, batch_id: str) -> str:
        """STRING: the token of the replica advancing the batch now (SET NX PX)."""
        return f"{self.prefix}batch_lock:{batch_id}"

    def todo(self, batch_id: str) -> str:
        """LIST: valid lines not yet fed to the bulk queue, in file order (JSON each)."""
        return f"{self.prefix}batch_todo:{batch_id}"

    def open(self, batch_id: str) -> str:
        """SET: job ids fed to the queue whose outcome is not recorded yet."""
        return f"{self.prefix}batch_open:{batch_id}"

    def jobs(self, batch_id: str) -> str:
        """ZSET: every job id fed for the batch (admit.lua's listing key for batch lines)."""
        return f"{self.prefix}batch_jobs:{batch_id}"

    def results(self, batch_id: str) -> str:
        """HASH: line number -> output line (JSON), one per successful line."""
        return f"{self.prefix}batch_results:{batch_id}"

    def errors(self, batch_id: str) -> str:
        """HASH: line number -> error line (JSON), one per failed, expired or cancelled line."""
        return f"{self.prefix}batch_errors:{batch_id}"
