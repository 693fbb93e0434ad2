"""Where file bytes live: a small storage interface and its local-folder implementation.

Metadata (owner, name, size) lives in Redis (`gateway.batch.files`); only bytes live here, by
file id. The methods are blocking: callers run them in a worker thread. An object store (S3,
GCS) implements the same four methods; replicas must share the storage, so a multi-replica
deployment puts the data folder on a shared volume or uses an object store.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

__all__ = ["FileStorage", "LocalFileStorage", "READ_CHUNK_BYTES"]

READ_CHUNK_BYTES = 1 << 20
# File ids name files on disk: a closed alphabet rules out path games ("../").
_FILE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


class FileStorage(Protocol):
    def put(self, file_id: str, data: bytes) -> None:
        """Store the bytes durably and atomically: readers see all of them or none."""

    def get(self, file_id: str) -> bytes:
        """All the bytes; FileNotFoundError when there are none."""

    def open_chunks(self, file_id: str) -> Iterator[bytes]:
        """The bytes in chunks (for streaming a large file); FileNotFoundError when none."""

    def delete(self, file_id: str) -> None:
        """Remove the bytes; no error when they are already gone."""


class LocalFileStorage:
    """One file per id under a folder; writes go to a temp file, fsync, rename, fsync folder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, file_id: str) -> Path:
        if not _FILE_ID.fullmatch(file_id):
            raise ValueError(f"not a file id: {file_id[:40]!r}")
        return self.root / file_id

    def put(self, file_id: str, data: bytes) -> None:
        path = self._path(file_id)
        self.root.mkdir(parents=True, exist_ok=True)
        temp = self.root / f".{file_id}.{secrets.token_hex(4)}.tmp"
        try:
            with temp.open("wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            # NOTE: rename is atomic within a folder, so a crash leaves the old bytes or the
            # new ones, never half; the folder fsync makes the rename itself durable.
            os.replace(temp, path)
        finally:
            temp.unlink(missing_ok=True)
        folder = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

    def get(self, file_id: str) -> bytes:
        return self._path(file_id).read_bytes()

    def open_chunks(self, file_id: str) -> Iterator[bytes]:
        # Opened here, not in the generator, so a missing file fails before streaming starts.
        handle = self._path(file_id).open("rb")
        return _chunks(handle)

    def delete(self, file_id: str) -> None:
        self._path(file_id).unlink(missing_ok=True)


def _chunks(handle: BinaryIO) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(READ_CHUNK_BYTES):
            yield chunk
