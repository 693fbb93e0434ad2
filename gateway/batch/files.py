"""File metadata in Redis (owner, name, size, purpose) and the bytes through `FileStorage`.

A file belongs to the tenant that uploaded it (or whose batch wrote it): another tenant's id
reads as unknown. Ids name both the metadata hash and the stored bytes.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from gateway.batch.file_storage import FileStorage
from gateway.batch.keys import BatchKeys
from gateway.queue.redis_text import redis_text

__all__ = ["FileRecord", "FileStore", "file_object", "new_file_id"]


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class FileRecord:
    file_id: str
    tenant: str
    size_bytes: int
    created_at_s: int
    filename: str
    # "batch" for uploads, "batch_output" for what a batch writes.
    purpose: str

    def to_hash(self) -> dict[str, str | int]:
        return {
            "id": self.file_id,
            "tenant": self.tenant,
            "bytes": self.size_bytes,
            "created_at": self.created_at_s,
            "filename": self.filename,
            "purpose": self.purpose,
        }

    @classmethod
    def from_hash(cls, raw: Mapping[Any, Any]) -> FileRecord:
        h = {redis_text(k): redis_text(v) for k, v in raw.items()}
        return cls(
            file_id=h["id"],
            tenant=h["tenant"],
            size_bytes=int(h["bytes"]),
            created_at_s=int(h["created_at"]),
            filename=h["filename"],
            purpose=h["purpose"],
        )


def file_object(record: FileRecord) -> dict[str, Any]:
    """A file as OpenAI's API shows it (`openai.types.FileObject`)."""
    return {
        "id": record.file_id,
        "object": "file",
        "bytes": record.size_bytes,
        "created_at": record.created_at_s,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


class FileStore:
    def __init__(
        self, redis: Redis, keys: BatchKeys, storage: FileStorage, scripts: dict[str, AsyncScript]
    ) -> None:
        self._redis = redis
        self.keys = keys
        self.storage = storage
        self._list_page = scripts["list_page"]

    async def create(self, record: FileRecord, data: bytes) -> None:
        """Bytes first (durable), then the metadata that makes them visible."""
        await asyncio.to_thread(self.storage.put, record.file_id, data)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(self.keys.file(record.file_id), mapping=dict[Any, Any](record.to_hash()))
        pipe.zadd(self.keys.tenant_files(record.tenant), {record.file_id: record.created_at_s})
        await pipe.execute()

    async def get(self, file_id: str, tenant: str) -> FileRecord | None:
        raw = await self._redis.hgetall(self.keys.file(file_id))
        if not raw:
            return None
        record = FileRecord.from_hash(raw)
        return record if record.tenant == tenant else None

    async def list_page(self, tenant: str, limit: int, after: str | None) -> list[FileRecord]:
        """The tenant's files, newest first, after the cursor id."""
        ids = await self._list_page(
            keys=[self.keys.tenant_files(tenant)], args=[after or "", limit]
        )
        pipe = self._redis.pipeline(transaction=False)
        for file_id in ids:
            pipe.hgetall(self.keys.file(redis_text(file_id)))
        return [FileRecord.from_hash(h) for h in await pipe.execute() if h]

    async def delete(self, record: FileRecord) -> None:
        """Metadata first (the file disappears for readers), then the bytes."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self.keys.file(record.file_id))
        pipe.zrem(self.keys.tenant_files(record.tenant), record.file_id)
        await pipe.execute()
        await asyncio.to_thread(self.storage.delete, record.file_id)

    async def read(self, record: FileRecord) -> bytes:
        return await asyncio.to_thread(self.storage.get, record.file_id)

    def chunks(self, record: FileRecord) -> Iterator[bytes]:
        """Blocking chunks (Starlette runs a sync iterator in its thread pool)."""
        return self.storage.open_chunks(record.file_id)
