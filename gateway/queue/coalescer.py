"""One Redis call per batch of arrivals instead of one per request.

Calls that arrive while a batch call is already on its way to Redis (or in the same event-loop
tick) wait together and go in the next batch call; each caller awaits its own result. One
batch call is in flight at a time, so a batch grows with the arrival rate, and a lone caller
waits one loop tick longer than a direct call would. Used for job admits (the admit script
takes a batch and admits it in order exactly as lone admits would) and for job status reads
(one pipeline of HMGETs): the client library's per-call cost, not Redis, was the limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    def __init__(
        self,
        call_many: Callable[[Sequence[Item]], Awaitable[list[Result]]],
        max_batch: int = 256,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._call_many = call_many
        self._max_batch = max_batch
        self._waiting: list[tuple[Item, asyncio.Future[Result]]] = []
        self._flusher: asyncio.Task[None] | None = None
        # Sizes of the batch calls made so far (tests and benchmarks read them); bounded.
        self.recent_batch_sizes: list[int] = []

    async def call(self, item: Item) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="coalescer")
        # NOTE: not shielded, as a direct call is not: a caller cancelled here may still have
        # its item sent (an admit then happens), exactly as when cancelled during its own call.
        return await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
                self._record(len(batch))
                try:
                    results = await self._call_many([item for item, _ in batch])
                except Exception as error:  # noqa: BLE001 - every caller of the batch sees it
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                except asyncio.CancelledError:
                    for _, future in batch + self._waiting:
                        future.cancel()
                    self._waiting.clear()
                    raise
                for (_, future), result in zip(batch, results, strict=True):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._flusher = None

    def _record(self, size: int) -> None:
        self.recent_batch_sizes.append(size)
        if len(self.recent_batch_sizes) > 1024:
            del self.recent_batch_sizes[:512]
