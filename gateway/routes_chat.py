"""POST /v1/chat/completions: OpenAI-compatible, streamed over SSE or answered as one body.

The request is queued like any other (so any replica may run it). Its handler registers as
the job's local listener right after admit: when this replica's dispatcher runs the job, the
tokens come in-process; when another replica runs it, over the request's Redis stream
(`gateway.local_delivery`). A client that goes away cancels the request: the replica running
it aborts it in its engine, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.errors import APIError, read_json_body
from gateway.intake import (
    Admitted,
    admit,
    authenticate,
    build_payload,
    interactive_deadline_s,
    request_class,
    require_model,
    require_ready,
)
from gateway.local_delivery import WATCHED_KEY, Listener
from gateway.redis_health import require_redis
from gateway.schemas import (
    chat_chunk_body,
    chat_completion_body,
    content_delta,
    parse_chat_request,
    role_delta,
)
from gateway.state import GatewayState
from gateway.token_stream import DELTA, END, ERROR, StreamEvent
from policies.request_class import RequestClass

log = structlog.get_logger("mixgate.chat")
# A client that sends this header with "1" gets the server's timings in the final chunk.
TIMINGS_HEADER = "x-mixgate-timings"
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


async def _body(request: Request, state: GatewayState) -> dict[str, Any]:
    settings = state.settings
    return await read_json_body(
        request, settings.max_body_bytes, read_timeout_s=settings.body_read_timeout_s
    )


def _frame(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


async def chat_completions(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    # Redis first: its 503 carries Retry-After and a precise code.
    require_redis(state)
    require_ready(state)
    principal = authenticate(request, state)
    body = parse_chat_request(await _body(request, state))
    require_model(state, body.model)
    cls = request_class(request, RequestClass.INTERACTIVE, body.service_tier, principal)
    # Marked as read by a handler, so whichever replica runs it sends its events somewhere.
    payload = build_payload(state, body, cls)
    payload = dataclasses.replace(payload, extra={**payload.extra, WATCHED_KEY: True})
    deadline_s = interactive_deadline_s(request) if cls is RequestClass.INTERACTIVE else None
    admitted = await admit(
        state, principal, cls, payload, deadline_s=deadline_s, id_prefix="chatcmpl-"
    )
    # No await since admit returned: the local dispatcher finds the listener when it runs the
    # job (one that came late would still be served, through the stream).
    assert state.streams is not None
    listener = state.streams.local.listen(admitted.job_id)
    state.metrics.requests.labels(cls.value, "chat", "admitted").inc()
    if payload.stream:
        timings = request.headers.get(TIMINGS_HEADER) == "1"
        return StreamingResponse(
            _sse(state, admitted, listener, principal.tenant, timings),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **admitted.prediction_headers},
        )
    return await _complete(state, admitted, listener, principal.tenant)


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


async def _sse(
    state: GatewayState, admitted: Admitted, listener: Listener, tenant: str, with_timings: bool
) -> AsyncIterator[bytes]:
    payload, job_id = admitted.payload, admitted.job_id
    usage = payload.include_usage

    def chunk(delta: dict[str, str], finish_reason: str | None) -> bytes:
        return _frame(
            chat_chunk_body(
                job_id, payload.created_s, payload.model, delta, finish_reason, include_usage=usage
            )
        )

    finished = False
    try:
        yield chunk(role_delta(), None)
        async for event in _events(state, listener):
            if event.kind == DELTA and event.data["text"]:
                yield chunk(content_delta(event.data["text"]), None)
            elif event.kind == END:
                last = chat_chunk_body(
                    job_id,
                    payload.created_s,
                    payload.model,
                    {},
                    event.data["finish_reason"],
                    include_usage=usage,
                )
                if with_timings:
                    # Opt-in extension (load generators): server-side queue delay and TTFT.
                    last["mixgate_timings"] = event.data.get("timings")
                yield _frame(last)
                if usage:
                    yield _frame(
                        chat_chunk_body(
                            job_id,
                            payload.created_s,
                            payload.model,
                            {},
                            None,
                            usage=event.data["usage"],
                        )
                    )
                _observe(state, admitted.request_class, event)
            elif event.kind == ERROR:
                yield _frame({"error": _error_object(event.data)})
        yield b"data: [DONE]\n\n"
        finished = True
    finally:
        _forget(state, listener)
        if not finished:
            await _cancel(state, job_id, tenant)


def _forget(state: GatewayState, listener: Listener) -> None:
    assert state.streams is not None
    state.streams.local.forget(listener)


async def _complete(
    state: GatewayState, admitted: Admitted, listener: Listener, tenant: str
) -> Response:
    payload, job_id = admitted.payload, admitted.job_id
    parts: list[str] = []
    try:
        async for event in _events(state, listener):
            if event.kind == DELTA:
                parts.append(event.data["text"])
            elif event.kind == END:
                _observe(state, admitted.request_class, event)
                body = chat_completion_body(
                    job_id,
                    payload.created_s,
                    payload.model,
                    "".join(parts),
                    event.data["finish_reason"],
                    event.data["usage"],
                )
                return JSONResponse(body)
            elif event.kind == ERROR:
                data = event.data
                status = int(data.get("status", 500))
                raise APIError(
                    status,
                    data.get("message", "failed"),
                    _error_object(data)["type"],
                    data.get("code"),
                )
    except asyncio.CancelledError:
        await _cancel(state, job_id, tenant)
        raise
    finally:
        _forget(state, listener)
    log.error("stream_ended_without_result", job_id=job_id)
    raise APIError.internal()


def _observe(state: GatewayState, cls: RequestClass, event: StreamEvent) -> None:
    state.metrics.requests.labels(cls.value, "chat", "completed").inc()


def _error_object(data: dict[str, Any]) -> dict[str, Any]:
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
