"""What the Files and Batch routes and the supervisor share, built once by the app's lifespan."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.batch.file_storage import LocalFileStorage
from gateway.batch.files import FileStore
from gateway.batch.keys import BatchKeys
from gateway.batch.store import BatchStore
from gateway.batch.supervisor import Supervisor, SupervisorConfig
from gateway.queue import QueueStore
from gateway.runtime.settings import Settings

__all__ = ["BatchRuntime"]


@dataclass(frozen=True, slots=True)
class BatchRuntime:
    files: FileStore
    batches: BatchStore
    supervisor: Supervisor

    @classmethod
    def create(
        cls, redis: Redis, queue: QueueStore, settings: Settings, bulk_queue_limit: int
    ) -> BatchRuntime:
        keys = BatchKeys(queue.keys)
        batches = BatchStore(redis, keys, queue)
        files = FileStore(redis, keys, LocalFileStorage(settings.files_dir), batches.scripts)
        config = SupervisorConfig(
            poll_interval_s=settings.batch_poll_interval_s,
            lock_ms=int(settings.batch_lock_s * 1000),
            max_queued_lines=settings.batch_max_queued_lines,
            max_attempts=settings.max_attempts,
            bulk_queue_limit=bulk_queue_limit,
        )
        return cls(files, batches, Supervisor(batches, files, queue, config))
