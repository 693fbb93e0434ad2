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

A *resumable* listener (the client asked for `stream_options.resumable`) numbers the events
delivered here (`0-1`, `0-2`, ...: their SSE `id:`) and keeps them; when its client leaves,
the handler `abandon`s it and the attached attempt hands over (`handover`): it writes those
events to the Redis stream under the same ids and sends the rest there too, so a resume on
any replica reads on from the client's `Last-Event-ID`.
While the client stays, nothing of this costs a Redis command.

NOTE: the stream read starts at once, before the job is claimed: when the job then runs here,
that one XREAD simply times out (it is never cancelled: redis-py would drop its connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import weakref
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

import structlog

from gateway.dispatch.stream_event import ERROR, StreamEvent, local_event_id

log = structlog.get_logger("mixgate.delivery")

# The job payload's `extra` key that says a handler reads the job's events (chat completions).
WATCHED_KEY = "token_stream"
# The payload's `extra` key of a stream its client may resume (`stream_options.resumable`).
RESUMABLE_KEY = "resumable"
# The last event of a handler whose stream another connection resumed (`take_over`).
RESUMED_ELSEWHERE: dict[str, Any] = {
    "status": 409,
    "code": "stream_resumed",
    "message": "another connection resumed this stream",
}


def is_watched(extra: dict[str, Any], stream: bool) -> bool:
    """Whether someone reads the job's events: chats mark it; a streamed one is always read."""
    return stream or bool(extra.get(WATCHED_KEY))


class Route(enum.Enum):
    LOCAL = "local"
    REDIS = "redis"
    NOBODY = "nobody"


class StreamReader(Protocol):
    """How a listener reads the job's Redis stream (`gateway.dispatch.token_stream`'s
    `TokenStreams`)."""

    async def read_once(self, request_id: str, after: str, block_ms: int) -> list[StreamEvent]:
        """The events after `after`, waiting up to block_ms for the first (may be none)."""
        ...


class Listener:
    """One HTTP handler on this replica waiting for one job's events."""

    def __init__(
        self,
        job_id: str,
        streams: StreamReader,
        block_ms: int,
        *,
        resumable: bool = False,
        after: str = "0-0",
    ) -> None:
        self.job_id = job_id
        self._streams = streams
        self._block_ms = block_ms
        # Where the stream reader starts (a resume: the client's Last-Event-ID).
        self._after = after
        self.resumable = resumable
        # Events delivered in-process so far, kept only for a resumable stream (handover).
        self._history: list[StreamEvent] = []
        self._local_count = 0
        # The handler left for good while the stream may be resumed: attempts hand over.
        self.abandoned = False
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

    def deliver_new(self, kind: str, data: dict[str, Any]) -> StreamEvent:
        """Deliver an event made by a local attempt: a resumable stream's under its next
        in-process id (and kept); any other's with none (nobody can use it, so no cost)."""
        if not self.resumable:
            event = StreamEvent(kind, data, "")
        else:
            self._local_count += 1
            event = StreamEvent(kind, data, local_event_id(self._local_count))
            self._history.append(event)
        self.deliver(event)
        return event

    def handover(self) -> tuple[list[StreamEvent], int]:
        """What an attempt writes to Redis when this listener's client has left: every event
        delivered in-process (with its id), and the index the stream's next event takes."""
        return list(self._history), self._local_count + 1

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

    def abandon(self) -> list[StreamEvent]:
        """The client left a resumable stream: the attached attempt (if any) moves the stream
        to Redis at its next event (`handover`); the caller then forgets the listener.

        Returns the events the caller must write to Redis itself: all of them when the
        attempt has finished already (its last event was delivered here, and the client may
        not have had it), since no attempt will hand them over; none otherwise."""
        self.abandoned = True
        if self._attached or not self._ended:
            return []
        return list(self._history)

    def close(self) -> None:
        self._closed = True
        # Wakes a reader that waits for its turn; one blocked in XREAD ends when that returns.
        self._read_redis.set()

    async def _read_stream(self) -> None:
        cursor = self._after
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
                data = {"status": 503, "code": "stream_unavailable", "message": repr(error)}
                self.deliver(StreamEvent(ERROR, data, ""))


# Stream readers still blocked in XREAD after their handler returned (kept from GC).
_READERS: set[asyncio.Task[None]] = set()


class LocalDelivery:
    """This replica's listeners by job id; the dispatcher routes each attempt through it."""

    def __init__(self, streams: StreamReader, block_ms: int = 1000) -> None:
        self._streams = streams
        self._block_ms = block_ms
        # NOTE: weak, so a handler that never started reading (its client left before the
        # response began) leaves nothing behind once its generator is collected.
        self._listeners: weakref.WeakValueDictionary[str, Listener] = weakref.WeakValueDictionary()

    def listen(self, job_id: str, *, resumable: bool = False) -> Listener:
        """Register a handler for `job_id`; keep a reference while it reads.

        Call it with no await since admit returned: a listener that is late is still served
        (through the stream), only at the cost of the Redis round trips.
        """
        if self._listeners.get(job_id) is not None:
            raise RuntimeError(f"a listener for {job_id} is registered already")
        listener = Listener(job_id, self._streams, self._block_ms, resumable=resumable)
        self._listeners[job_id] = listener
        return listener

    def follow(self, job_id: str, after: str) -> Listener:
        """A reader of the job's Redis stream from after `after` (a resume), not registered:
        no attempt attaches to it, since the stream of a resumed job lives in Redis."""
        return Listener(job_id, self._streams, self._block_ms, resumable=True, after=after)

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

    def take_over(self, job_id: str) -> bool:
        """A client resumed `job_id`'s stream while its first handler still listens here (its
        client is gone, e.g. a half-open connection, but this server has not noticed): that
        handler ends with an error event, and the attempt hands the stream over to Redis,
        where the resume reads it. False when no resumable listener of the job is here."""
        listener = self._listeners.get(job_id)
        if listener is None or not listener.resumable:
            return False
        listener.abandon()
        listener.deliver(StreamEvent(ERROR, RESUMED_ELSEWHERE, ""))
        del self._listeners[job_id]
        return True

    def route(self, job_id: str, token: int, watched: bool) -> tuple[Route, Listener | None]:
        """Where attempt `token` of `job_id` sends its events; LOCAL attaches the listener."""
        listener = self._listeners.get(job_id)
        if listener is not None:
            listener.attach(token)
            return Route.LOCAL, listener
        return (Route.REDIS if watched else Route.NOBODY), None

    def listening(self) -> int:
        return len(self._listeners)
