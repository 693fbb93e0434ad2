"""What chat and legacy completions share after the request is parsed: admit the job, listen
for its events, and answer them as one body (here) or as an SSE stream (sse.py; the events
themselves: job_events.py).

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
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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
from gateway.dispatch.stream_event import DELTA, END, ERROR
from gateway.http.auth import Principal
from gateway.http.body import read_json_body
from gateway.http.errors import APIError
from gateway.http.job_events import (
    ResponseShape,
    cancel_request,
    count_completed,
    error_object,
    request_events,
    stop_listening,
)
from gateway.http.schemas_sampling import SamplingRequest
from gateway.http.sse import TIMINGS_HEADER, SseAnswer, sse_response
from gateway.http.state import GatewayState
from gateway.queue.payload import JobPayload
from gateway.runtime.redis_health import require_redis
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.generation")


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
    # Wall clock when its handler began (after uvicorn parsed its head): intake's start.
    received_s: float


async def accept_request(request: Request, parse: Callable[[Any], Body]) -> Accepted[Body]:
    """Queue store and readiness, key and rate limit, the parsed body, its model, its class."""
    received_s = time.time()
    state: GatewayState = request.app.state.gw
    # Redis first: its 503 carries Retry-After and a precise code.
    require_redis(state)
    require_ready(state)
    principal = authenticate(request, state)
    body = parse(await read_body(request, state))
    require_model(state, body.model)
    cls = request_class(request, RequestClass.INTERACTIVE, body.service_tier, principal)
    return Accepted(state, principal, body, cls, received_s)


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
    # Until its first text, bulk intake takes fewer slots on the loop (intake_lane.py).
    ticket = state.intake_lane.chat_arrived() if cls is RequestClass.INTERACTIVE else None
    try:
        admitted = await admit(
            state, principal, cls, payload, deadline_s=deadline_s, id_prefix=id_prefix
        )
        # No await since admit returned: the local dispatcher finds the listener when it runs
        # the job (one that came late would still be served, through the stream).
        assert state.streams is not None
        listener = state.streams.local.listen(admitted.job_id, resumable=resumable)
        state.metrics.requests.labels(cls.value, shape.endpoint, "admitted").inc()
        extra_headers = dict(headers or {})
        if payload.stream:
            stream = SseAnswer(state, admitted, listener, principal.tenant, shape)
            stream.with_timings = request.headers.get(TIMINGS_HEADER) == "1"
            stream.received_s = accepted.received_s
            stream.usage_in_every_chunk = continuous_usage(accepted.body)
            # The stream releases it at its first text (or its end).
            stream.chat_ticket, ticket = ticket, None
            return sse_response(stream, {**admitted.prediction_headers, **extra_headers})
        body = await _complete(state, admitted, listener, principal.tenant, shape)
        return JSONResponse(body, headers=extra_headers)
    finally:
        if ticket is not None:
            ticket.release()


async def _complete(
    state: GatewayState, admitted: Admitted, listener: Listener, tenant: str, shape: ResponseShape
) -> dict[str, Any]:
    parts: list[str] = []
    try:
        async for event in request_events(state, listener):
            if event.kind == DELTA:
                parts.append(event.data["text"])
            elif event.kind == END:
                count_completed(state, admitted.request_class, shape)
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
        await cancel_request(state, admitted.job_id, tenant)
        raise
    finally:
        stop_listening(state, listener)
    log.error("stream_ended_without_result", job_id=admitted.job_id)
    raise APIError.internal()
