"""The SSE answer of a streamed chat or legacy completion: the endpoint's chunks as `data:`
frames, then `data: [DONE]`; usage in the chunks as the request asked; error frames; and, on a
resumable stream, each event's id (`id:` lines) and the hand-over to Redis with a grace timer
when its client leaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import structlog
from starlette.responses import StreamingResponse

from gateway.admission.intake import Admitted
from gateway.admission.intake_lane import ChatTicket
from gateway.dispatch.local_delivery import Listener
from gateway.dispatch.resume_grace import start_grace
from gateway.dispatch.stream_event import DELTA, END, ERROR
from gateway.http.job_events import (
    ResponseShape,
    cancel_request,
    count_completed,
    error_object,
    request_events,
    stop_listening,
)
from gateway.http.schemas import usage_body
from gateway.http.state import GatewayState

__all__ = ["SSE_HEADERS", "TIMINGS_HEADER", "SseAnswer", "sse_frame", "sse_response"]

log = structlog.get_logger("mixgate.generation")
# A client that sends this header with "1" gets the server's timings in the final chunk.
TIMINGS_HEADER = "x-mixgate-timings"
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def sse_response(stream: SseAnswer, headers: Mapping[str, str]) -> StreamingResponse:
    return StreamingResponse(
        stream.frames(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
    )


def sse_frame(body: dict[str, Any], event_id: str = "") -> bytes:
    # orjson: ~1 us a chunk instead of ~10 (json.dumps), the same compact JSON.
    data = b"data: " + orjson.dumps(body) + b"\n\n"
    return b"id: " + event_id.encode() + b"\n" + data if event_id else data


class SseAnswer:
    """One streamed answer: the shape's chunks, then `data: [DONE]`."""

    def __init__(
        self,
        state: GatewayState,
        admitted: Admitted,
        listener: Listener,
        tenant: str,
        shape: ResponseShape,
    ) -> None:
        self.state, self.admitted, self.listener, self.tenant = state, admitted, listener, tenant
        self.shape = shape
        self.with_timings = False
        # Wall clock when the handler began (None for a resume): the timings' intake_s.
        self.received_s: float | None = None
        # Wall clock when the first text chunk was handed to the response: delivery_s.
        self.first_text_written_s: float | None = None
        # An interactive stream's place in the intake lane, released at its first text.
        self.chat_ticket: ChatTicket | None = None
        self.usage_in_every_chunk = False
        self.completion_tokens = 0
        # False for a resume from a Last-Event-ID: the client has the role chunk already.
        self.send_first_chunk = True
        # The job's reader epoch of this reader (0: the request's own; a resume's is from
        # `QueueStore.resume_reader`), which its grace timer carries.
        self.reader_epoch = 0

    def _with_usage(
        self, body: dict[str, Any], usage: Mapping[str, int] | None = None, event_id: str = ""
    ) -> bytes:
        if self.usage_in_every_chunk:
            prompt_tokens = len(self.admitted.payload.prompt_token_ids)
            body["usage"] = usage_body(
                usage
                or {"prompt_tokens": prompt_tokens, "completion_tokens": self.completion_tokens}
            )
        elif self.admitted.payload.include_usage:
            body["usage"] = None  # as OpenAI's chunks before the usage chunk
        return sse_frame(body, event_id)

    async def frames(self) -> AsyncIterator[bytes]:
        shape, admitted = self.shape, self.admitted
        finished = False
        # The END event's frames, written with [DONE] in one piece.
        tail = b""
        try:
            first = shape.first_chunk(admitted) if self.send_first_chunk else None
            if first is not None:
                yield self._with_usage(first)
            # Ids only where a client can use them: every other stream keeps OpenAI's bytes.
            with_ids = self.listener.resumable
            async for event in request_events(self.state, self.listener):
                event_id = event.entry_id if with_ids else ""
                if event.kind == DELTA:
                    self.completion_tokens += len(event.data.get("token_ids", ()))
                    if event.data["text"]:
                        chunk = shape.text_chunk(admitted, event.data["text"])
                        if self.first_text_written_s is None:
                            self.first_text_written_s = time.time()
                            self._release_ticket()
                        yield self._with_usage(chunk, event_id=event_id)
                elif event.kind == END:
                    last = shape.finish_chunk(admitted, event.data["finish_reason"])
                    if self.with_timings:
                        # Opt-in extension (load generators): server-side queue delay and TTFT.
                        last["mixgate_timings"] = self._timings(event.data.get("timings"))
                    # One write for the event's frames and [DONE] (below): a client that has
                    # its id has had all of them, so a resume after it misses nothing.
                    tail = self._with_usage(last, event.data["usage"], event_id)
                    if admitted.payload.include_usage:
                        tail += sse_frame(shape.usage_chunk(admitted, event.data["usage"]))
                    count_completed(self.state, admitted.request_class, shape)
                elif event.kind == ERROR:
                    yield sse_frame({"error": error_object(event.data)}, event_id)
            yield tail + b"data: [DONE]\n\n"
            finished = True
        finally:
            self._release_ticket()
            self._leave(finished)
            if not finished and not self.listener.resumable:
                await cancel_request(self.state, admitted.job_id, self.tenant)

    def _release_ticket(self) -> None:
        if self.chat_ticket is not None:
            self.chat_ticket.release()

    def _timings(self, engine_timings: dict[str, Any] | None) -> dict[str, Any] | None:
        """The END event's timings plus this handler's own two, both wall clock:
        ``intake_s`` (handler start -> admitted: auth, parse, tokenize, admission, enqueue) and
        ``delivery_s`` (first text sampled -> its chunk handed to the response), in ms steps
        (admission's time is kept in ms)."""
        if engine_timings is None:
            return None
        timings = dict(engine_timings)
        admitted_s = self.admitted.enqueue_ms / 1000.0
        if self.received_s is not None:
            timings["intake_s"] = max(0.0, admitted_s - self.received_s)
        text_ttft_s = timings.get("text_ttft_s")
        if self.first_text_written_s is not None and isinstance(text_ttft_s, int | float):
            timings["delivery_s"] = max(0.0, self.first_text_written_s - admitted_s - text_ttft_s)
        return timings

    def _leave(self, finished: bool) -> None:
        """Stop listening; a resumable stream left unfinished is abandoned (no await before:
        the attempt must see it at its next event) and gets its grace timer."""
        orphans = self.listener.abandon() if not finished and self.listener.resumable else []
        stop_listening(self.state, self.listener)
        assert self.state.streams is not None
        for event in orphans:
            # The job ended before its client left: its events go to Redis from here.
            written = self.state.streams.batched.enqueue(
                self.admitted.job_id, event.kind, event.data, event.entry_id
            )
            written.add_done_callback(_log_write_failure)
        if not finished and self.listener.resumable:
            assert self.state.store is not None
            start_grace(
                self.state.store,
                self.admitted.job_id,
                self.tenant,
                self.reader_epoch,
                self.state.settings.stream_resume_grace_s,
                lambda: int(time.time() * 1000),
            )


def _log_write_failure(written: asyncio.Future[None]) -> None:
    if not written.cancelled() and written.exception() is not None:
        log.warning("stream_write_failed", error=repr(written.exception()))
