"""In-process token delivery: a chat whose job runs on the replica that holds its HTTP client
gets its events through an asyncio queue, and Redis carries them only when it runs elsewhere.

The rule, decided per attempt by the dispatcher when the attempt emits its first event
(`LocalDelivery.route`): a listener registered here for the job -> `LOCAL` (events into its
queue, nothing into the job's Redis stream); no listener but the job is watched (a chat: some
replica's handler reads it) -> `REDIS` (the stream, as before); neither -> `NOBODY` (bulk jobs:
their result is written once by `complete()`, no per-token traffic).

A listener reads the Redis stream unless a local attempt is attached to it, so every case in
which the tokens go to Redis is covered without knowing who claimed the job: another replica
(claim classes), this replica before the handler registered (it registers right after admit,
so only in a race), a later attempt after a lost lease, or an error that a reclaim sweep or
an expiring claim wrote. Each attempt writes to exactly one of the two places, and the queue
merges them in arrival order, so no event is lost or seen twice. A local attempt that ends
without delivering a last event (lease lost, handed back at drain) detaches, and the listener
goes back to the stream, where whoever finishes the job writes the last event.

NOTE: the stream read starts at once, before the job is claimed: when the job then runs here,
that one XREAD simply times out (it is never cancelled: redis-py would drop its connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:  # token_stream builds the registry; importing it here would be circular
    from gateway.dispatch.token_stream import StreamEvent, TokenStreams

log = structlog.get_logger("mixgate.delivery")

# The job payload's `extra` key that says a handler reads the job's events (chat completions).
WATCHED_KEY = "token_stream"


def is_watched(extra: dict[str, Any], stream: bool) -> bool:
    """Whether someone reads the job's events: chats mark it; a streamed one is always read."""
    return stream or bool(extra.get(WATCHED_KEY))


class Route(enum.Enum):
    LOCAL = "local"
    REDIS = "redis"
    NOBODY = "nobody"


class Listener:
    """One HTTP handler on this replica waiting for one job's events."""

    def __init__(self, job_id: str, streams: TokenStreams, block_ms: int) -> None:
        self.job_id = job_id
        self._streams = streams
        self._block_ms = block_ms
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        # Lease tokens of the local attempts delivering here now.
        self._attached: set[int] = set()
        # Set while no local attempt is attached: the stream reader reads the Redis stream.
        self._read_redis = asyncio.Event()
        self._read_redis.set()
        self._closed = False
        # A last event was queued (from either place).
        self._ended = False
        self._reader: asyncio.Task[None] | None = None

    # -- the dispatcher's side ----------------------------------------------------------------

    def attach(self, token: int) -> None:
        self._attached.add(token)
        self._read_redis.clear()

    def deliver(self, event: StreamEvent) -> None:
        if self._closed or self._ended:
            return
        self._queue.put_nowait(event)
        if event.is_last:
            # The handler stops at the first last event: nothing more is read from anywhere.
            self._ended = True

    def detach(self, token: int) -> None:
        """The attempt ended; without a last event delivered the listener reads Redis again."""
        self._attached.discard(token)
        if not self._attached and not self._ended:
            self._read_redis.set()

    # -- the handler's side -------------------------------------------------------------------

    async def events(self) -> AsyncGenerator[StreamEvent, None]:
        """Every event of the job, from whichever place it comes, up to the last one."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_stream(), name=f"read-{self.job_id}")
            _READERS.add(self._reader)
            self._reader.add_done_callback(_READERS.discard)
        while True:
            event = await self._queue.get()
            yield event
            if event.is_last:
                return

    def close(self) -> None:
        self._closed = True
        # Wakes a reader that waits for its turn; one blocked in XREAD ends when that returns.
        self._read_redis.set()

    async def _read_stream(self) -> None:
        cursor = "0-0"
        try:
            while True:
                await self._read_redis.wait()
                if self._closed or self._ended:
                    return
                events = await self._streams.read_once(self.job_id, cursor, self._block_ms)
                for event in events:
                    cursor = event.entry_id
                    self.deliver(event)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the handler's idle timeout ends the wait
            if not self._closed:
                log.warning("stream_read_failed", job_id=self.job_id, error=repr(error))
                from gateway.dispatch.token_stream import ERROR, StreamEvent

                data = {"status": 503, "code": "stream_unavailable", "message": repr(error)}
                self.deliver(StreamEvent(ERROR, data, ""))


# Stream readers still blocked in XREAD after their handler returned (kept from GC).
_READERS: set[asyncio.Task[None]] = set()


class LocalDelivery:
    """This replica's listeners by job id; the dispatcher routes each attempt through it."""

    def __init__(self, streams: TokenStreams, block_ms: int = 1000) -> None:
        self._streams = streams
        self._block_ms = block_ms
        # NOTE: weak, so a handler that never started reading (its client left before the
        # response began) leaves nothing behind once its generator is collected.
        self._listeners: weakref.WeakValueDictionary[str, Listener] = weakref.WeakValueDictionary()

    def listen(self, job_id: str) -> Listener:
        """Register a handler for `job_id`; keep a reference while it reads.

        Call it with no await since admit returned: a listener that is late is still served
        (through the stream), only at the cost of the Redis round trips.
        """
        if self._listeners.get(job_id) is not None:
            raise RuntimeError(f"a listener for {job_id} is registered already")
        listener = Listener(job_id, self._streams, self._block_ms)
        self._listeners[job_id] = listener
        return listener

    def forget(self, listener: Listener) -> None:
        listener.close()
        if self._listeners.get(listener.job_id) is listener:
            del self._listeners[listener.job_id]

    @contextlib.asynccontextmanager
    async def subscription(self, job_id: str) -> AsyncIterator[Listener]:
        listener = self.listen(job_id)
        try:
            yield listener
        finally:
            self.forget(listener)

    def route(self, job_id: str, token: int, watched: bool) -> tuple[Route, Listener | None]:
        """Where attempt `token` of `job_id` sends its events; LOCAL attaches the listener."""
        listener = self._listeners.get(job_id)
        if listener is not None:
            listener.attach(token)
            return Route.LOCAL, listener
        return (Route.REDIS if watched else Route.NOBODY), None

    def listening(self) -> int:
        return len(self._listeners)
