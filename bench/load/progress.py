"""A live per-class progress bar of a load run: sent / done / in flight / rejected."""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from bench.load.records import REJECTED, RequestRecord
from bench.load.workload import PlannedRequest, Workload

__all__ = ["LoadProgress"]


class LoadProgress:
    """Implements RecordListener; a no-op when disabled (tests)."""

    def __init__(self, workload: Workload, plan: list[PlannedRequest], enabled: bool) -> None:
        self._sent: Counter[str] = Counter()
        self._done: Counter[str] = Counter()
        self._rejected: Counter[str] = Counter()
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        if not enabled:
            return
        planned = Counter(req.request_class.value for req in plan)
        self._progress = Progress(
            TextColumn("{task.description:<12}"),
            BarColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
        )
        for cls in workload.classes:
            # Closed-loop classes have no plan to count towards: an open-ended bar.
            total = planned[cls.value] or None
            self._tasks[cls.value] = self._progress.add_task(
                cls.value, total=total, stats=self._stats(cls.value)
            )

    def _stats(self, cls: str) -> str:
        in_flight = self._sent[cls] - self._done[cls]
        return (
            f"sent {self._sent[cls]}  done {self._done[cls]}  "
            f"in flight {in_flight}  rejected {self._rejected[cls]}"
        )

    def _update(self, cls: str) -> None:
        if self._progress is not None and cls in self._tasks:
            self._progress.update(
                self._tasks[cls], completed=self._done[cls], stats=self._stats(cls)
            )

    def started(self, record: RequestRecord) -> None:
        self._sent[record.request_class] += 1
        self._update(record.request_class)

    def finished(self, record: RequestRecord) -> None:
        self._done[record.request_class] += 1
        if record.outcome == REJECTED:
            self._rejected[record.request_class] += 1
        self._update(record.request_class)

    def __enter__(self) -> LoadProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
