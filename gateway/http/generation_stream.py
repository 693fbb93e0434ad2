"""What chat and legacy completions share after the request is parsed: admit the job, listen
for its events, and answer them as one body or as an SSE stream.

The two endpoints differ only in how the prompt is tokenized and in the JSON of their chunks
and bodies (`ResponseShape`); queueing, delivery, cancel on disconnect, the idle timeout, the
usage chunk (`stream_options.include_usage`), usage in every chunk (vLLM's
`stream_options.continuous_usage_stats`) and the error frames are the same code.

A stream the client asked to be resumable (`stream_options.resumable`) carries each event's
id on its frames (`id: <stream id>`, `gateway.dispatch.stream_event`): what the client sends back as
`Last-Event-ID` to resume it (`gateway.http.routes_chat_resume`). Other streams keep OpenAI's
bytes exactly (`data:` lines only). When such a client leaves, the generation is not
cancelled at once: its stream moves to Redis and a grace timer (`gateway.dispatch.resume_grace`)
cancels it unless some client resumes it in time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import anyio
import orjson
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.admission.intake import (
    Admitted,
    admit,
    authenticate,
    interactive_deadline_s,
    request_class,
    require_model,
    require_ready,
)
from gateway.dispatch.local_delivery import RESUMABLE_KEY, WATCHED_KEY, Listener
from gateway.dispatch.resume_grace import start_grace
from gateway.dispatch.stream_event import DELTA, END, ERROR, StreamEvent
from gateway.http.auth import Principal
from gateway.http.body import read_json_body
from gateway.http.errors import APIError
from gateway.http.schemas import usage_body
from gateway.http.schemas_chat import SamplingRequest
from gateway.http.state import GatewayState
from gateway.queue.payload import JobPayload
from gateway.runtime.redis_health import require_redis
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.generation")
# A client that sends this header with "1" gets the server's timings in the final chunk.
TIMINGS_HEADER = "x-mixgate-timings"
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class ResponseShape(Protocol):
    """The endpoint's JSON: chunk bodies of a stream, and the body of a whole answer.

    `usage` on a chunk: None leaves it out; with `include_usage` the stream's chunks carry
    `"usage": null` (OpenAI) or the usage so far (continuous usage), which the caller passes.
    """

    endpoint: str  # the metrics label

    def first_chunk(self, admitted: Admitted) -> dict[str, Any] | None: ...

    def text_chunk(self, admitted: Admitted, text: str) -> dict[str, Any]: ...

    def finish_chunk(self, admitted: Admitted, finish_reason: str) -> dict[str, Any]: ...

    def usage_chunk(self, admitted: Admitted, usage: Mapping[str, int]) -> dict[str, Any]: ...

    def whole_body(
        self, admitted: Admitted, text: str, finish_reason: str, usage: Mapping[str, int]
    ) -> dict[str, Any]: ...


async def read_body(request: Request, state: GatewayState) -> dict[str, Any]:
    settings = state.settings
    return await read_json_body(
        request, settings.max_body_bytes, read_timeout_s=settings.body_read_timeout_s
    )


Body = TypeVar("Body", bound=SamplingRequest)


@dataclasses.dataclass(frozen=True, slots=True)
class Accepted(Generic[Body]):
    """A generation request that passed the checks before tokenizing: who, what, which class."""

    state: GatewayState
    principal: Principal
    body: Body
    request_class: RequestClass


async def accept_request(request: Request, parse: Callable[[Any], Body]) -> Accepted[Body]:
    """Queue store and readiness, key and rate limit, the parsed body, its model, its class."""
    state: GatewayState = request.app.state.gw
    # Redis first: its 503 carries Retry-After and a precise code.
    require_redis(state)
    require_ready(state)
    principal = authenticate(request, state)
    body = parse(await read_body(request, state))
    require_model(state, body.model)
    cls = request_class(request, RequestClass.INTERACTIVE, body.service_tier, principal)
    return Accepted(state, principal, body, cls)


def continuous_usage(body: SamplingRequest) -> bool:
    """vLLM's `stream_options.continuous_usage_stats` (with `include_usage`, as vLLM reads it)."""
    options = body.stream_options
    return bool(options and options.include_usage and options.continuous_usage_stats)


async def admit_and_answer(
    request: Request,
    accepted: Accepted[Any],
    payload: JobPayload,
    shape: ResponseShape,
    *,
    id_prefix: str,
    headers: Mapping[str, str] | None = None,
    resumable: bool = False,
) -> Response:
    """Queue the job (marked as watched), listen for it, and answer as the body asks;
    `resumable`: a stream its client may leave and resume (`stream_options.resumable`)."""
    state, principal, cls = accepted.state, accepted.principal, accepted.request_class
    resumable = resumable and payload.stream
    # Marked as read by a handler, so whichever replica runs it sends its events somewhere.
    extra = {**payload.extra, WATCHED_KEY: True}
    if resumable:
        extra[RESUMABLE_KEY] = True
    payload = dataclasses.replace(payload, extra=extra)
    deadline_s = interactive_deadline_s(request) if cls is RequestClass.INTERACTIVE else None
    admitted = await admit(
        state, principal, cls, payload, deadline_s=deadline_s, id_prefix=id_prefix
    )
    # No await since admit returned: the local dispatcher finds the listener when it runs the
    # job (one that came late would still be served, through the stream).
    assert state.streams is not None
    listener = state.streams.local.listen(admitted.job_id, resumable=resumable)
    state.metrics.requests.labels(cls.value, shape.endpoint, "admitted").inc()
    extra_headers = dict(headers or {})
    if payload.stream:
        stream = SseAnswer(state, admitted, listener, principal.tenant, shape)
        stream.with_timings = request.headers.get(TIMINGS_HEADER) == "1"
        stream.usage_in_every_chunk = continuous_usage(accepted.body)
        return sse_response(stream, {**admitted.prediction_headers, **extra_headers})
    body = await _complete(state, admitted, listener, principal.tenant, shape)
    return JSONResponse(body, headers=extra_headers)


def sse_response(stream: SseAnswer, headers: Mapping[str, str]) -> StreamingResponse:
    return StreamingResponse(
        stream.frames(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
    )


def _frame(body: dict[str, Any], event_id: str = "") -> bytes:
    # orjson: ~1 us a chunk instead of ~10 (json.dumps), the same compact JSON.
    data = b"data: " + orjson.dumps(body) + b"\n\n"
    return b"id: " + event_id.encode() + b"\n" + data if event_id else data


async def _events(state: GatewayState, listener: Listener) -> AsyncIterator[StreamEvent]:
    """The request's events; silence past the idle timeout is an error."""
    events = listener.events()
    try:
        while True:
            try:
                async with asyncio.timeout(state.settings.stream_idle_timeout_s):
                    event = await anext(events)
            except StopAsyncIteration:
                return
            except TimeoutError:
                yield StreamEvent(
                    ERROR,
                    {
                        "status": 504,
                        "code": "stream_timeout",
                        "message": "no tokens arrived in time",
                    },
                    "",
                )
                return
            yield event
            if event.is_last:
                return
    finally:
        await events.aclose()


async def _cancel(state: GatewayState, job_id: str, tenant: str) -> None:
    # Shielded: the handler's scope is already cancelled when the client has gone.
    with anyio.CancelScope(shield=True):
        assert state.store is not None
        try:
            await state.store.cancel(job_id, tenant, int(time.time() * 1000))
        except Exception:  # noqa: BLE001 - a failed cancel must not mask the disconnect
            log.warning("cancel_failed", job_id=job_id, exc_info=True)


def _forget(state: GatewayState, listener: Listener) -> None:
    assert state.streams is not None
    state.streams.local.forget(listener)


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
        return _frame(body, event_id)

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
            async for event in _events(self.state, self.listener):
                event_id = event.entry_id if with_ids else ""
                if event.kind == DELTA:
                    self.completion_tokens += len(event.data.get("token_ids", ()))
                    if event.data["text"]:
                        chunk = shape.text_chunk(admitted, event.data["text"])
                        yield self._with_usage(chunk, event_id=event_id)
                elif event.kind == END:
                    last = shape.finish_chunk(admitted, event.data["finish_reason"])
                    if self.with_timings:
                        # Opt-in extension (load generators): server-side queue delay and TTFT.
                        last["mixgate_timings"] = event.data.get("timings")
                    # One write for the event's frames and [DONE] (below): a client that has
                    # its id has had all of them, so a resume after it misses nothing.
                    tail = self._with_usage(last, event.data["usage"], event_id)
                    if admitted.payload.include_usage:
                        tail += _frame(shape.usage_chunk(admitted, event.data["usage"]))
                    _observe(self.state, admitted.request_class, shape)
                elif event.kind == ERROR:
                    yield _frame({"error": error_object(event.data)}, event_id)
            yield tail + b"data: [DONE]\n\n"
            finished = True
        finally:
            self._leave(finished)
            if not finished and not self.listener.resumable:
                await _cancel(self.state, admitted.job_id, self.tenant)

    def _leave(self, finished: bool) -> None:
        """Stop listening; a resumable stream left unfinished is abandoned (no await before:
        the attempt must see it at its next event) and gets its grace timer."""
        orphans = self.listener.abandon() if not finished and self.listener.resumable else []
        _forget(self.state, self.listener)
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


async def _complete(
    state: GatewayState, admitted: Admitted, listener: Listener, tenant: str, shape: ResponseShape
) -> dict[str, Any]:
    parts: list[str] = []
    try:
        async for event in _events(state, listener):
            if event.kind == DELTA:
                parts.append(event.data["text"])
            elif event.kind == END:
                _observe(state, admitted.request_class, shape)
                return shape.whole_body(
                    admitted, "".join(parts), event.data["finish_reason"], event.data["usage"]
                )
            elif event.kind == ERROR:
                data = event.data
                status = int(data.get("status", 500))
                raise APIError(
                    status,
                    data.get("message", "failed"),
                    error_object(data)["type"],
                    data.get("code"),
                )
    except asyncio.CancelledError:
        await _cancel(state, admitted.job_id, tenant)
        raise
    finally:
        _forget(state, listener)
    log.error("stream_ended_without_result", job_id=admitted.job_id)
    raise APIError.internal()


def _observe(state: GatewayState, cls: RequestClass, shape: ResponseShape) -> None:
    state.metrics.requests.labels(cls.value, shape.endpoint, "completed").inc()


def error_object(data: dict[str, Any]) -> dict[str, Any]:
    status = int(data.get("status", 500))
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    return {
        "message": data.get("message", "failed"),
        "type": kind,
        "code": data.get("code"),
        "param": None,
    }
