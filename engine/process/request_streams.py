"""Per-request delta queues on the event loop, shared by both engine bridges (the in-thread
`AsyncEngine` and the engine-core process's `EngineCoreClient`).

Whatever runs the engine puts each request's `RequestOutput` deltas (or the error that ends
it) on the request's queue; `generate()` drains it. Leaving the iterator early aborts the
request, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from engine.core.errors import RequestValidationError
from engine.core.request import RequestOutput

StreamItem = RequestOutput | BaseException


class RequestStreams:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[StreamItem]] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._queues

    def ids(self) -> list[str]:
        return list(self._queues)

    def put(self, request_id: str, item: StreamItem) -> None:
        """Hand one delta or error to the request's consumer (dropped when it has gone)."""
        queue = self._queues.get(request_id)
        if queue is not None:
            queue.put_nowait(item)

    async def consume(
        self, request_id: str, submit: Callable[[], None], abort: Callable[[str], None]
    ) -> AsyncIterator[RequestOutput]:
        """Register the request, `submit()` it, yield its deltas up to the finishing one."""
        if request_id in self._queues:
            raise RequestValidationError(
                f"request id {request_id!r} is already running", code="duplicate_id"
            )
        queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            submit()
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                abort(request_id)
