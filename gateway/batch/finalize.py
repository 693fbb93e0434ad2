"""The end of a batch: its output and error files, then its terminal status.

Idempotent: the file ids are derived from the batch id and the bytes from the recorded lines
(in input-file order), so a replica that dies mid-way and the one that takes over write the same
files; the terminal status is set once (a fenced compare-and-set).
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.batch.files import FileRecord, FileStore
from gateway.batch.records import BatchRecord, BatchStatus, StopReason
from gateway.batch.store import BatchStore, PassAborted

__all__ = ["finalize", "output_file_id"]

_FINAL = {
    StopReason.NONE: BatchStatus.COMPLETED,
    StopReason.CANCELLED: BatchStatus.CANCELLED,
    StopReason.EXPIRED: BatchStatus.EXPIRED,
}
_NOT_TERMINAL = [s.value for s in BatchStatus if not s.terminal]


def output_file_id(batch_id: str, kind: str) -> str:
    return f"file-{batch_id}-{kind}"


async def _write(
    files: FileStore, record: BatchRecord, kind: str, lines: Mapping[int, str], now_s: int
) -> str:
    file_id = output_file_id(record.batch_id, kind)
    data = "".join(lines[n] + "\n" for n in sorted(lines)).encode()
    name = f"{record.batch_id}_{kind}.jsonl"
    await files.create(
        FileRecord(file_id, record.tenant, len(data), now_s, name, "batch_output"), data
    )
    return file_id


async def finalize(
    store: BatchStore, files: FileStore, record: BatchRecord, token: str, now_s: int
) -> BatchStatus:
    """Write the files and set the terminal status; returns the status it set."""
    final = _FINAL[record.stop]
    if final is BatchStatus.COMPLETED:
        outcome = await store.transition(
            record.batch_id, [BatchStatus.IN_PROGRESS.value], BatchStatus.FINALIZING.value,
            {"finalizing_at": now_s}, token,
        )  # fmt: skip
        if outcome not in ("ok", BatchStatus.FINALIZING.value):
            # Cancelled meanwhile (or the lock lapsed): the next pass decides again.
            raise PassAborted(f"batch {record.batch_id} could not finalize: {outcome}")
    results, errors = await store.outcomes(record.batch_id)
    fields: dict[str, str | int] = {f"{final.value}_at": now_s}
    fields["output_file_id"] = (
        await _write(files, record, "output", results, now_s) if results else ""
    )
    fields["error_file_id"] = await _write(files, record, "error", errors, now_s) if errors else ""
    outcome = await store.transition(record.batch_id, _NOT_TERMINAL, final.value, fields, token)
    if outcome != "ok":
        raise PassAborted(f"batch {record.batch_id} could not become {final}: {outcome}")
    return final
