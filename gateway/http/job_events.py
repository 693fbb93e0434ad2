"""A handler's side of one admitted generation: its events as they arrive (with the idle
timeout), cancelling it, letting go of it, counting it, and the JSON an endpoint answers with
(`ResponseShape`). Shared by the whole-body answer (generation_stream.py) and the SSE answer
(sse.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import anyio
import structlog

from gateway.admission.intake import Admitted
from gateway.dispatch.local_delivery import Listener
from gateway.dispatch.stream_event import ERROR, StreamEvent
from gateway.http.state import GatewayState
from policies.request_class import RequestClass

__all__ = [
    "ResponseShape",
    "cancel_request",
    "count_completed",
    "error_object",
    "request_events",
    "stop_listening",
]

log = structlog.get_logger("mixgate.generation")


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


async def request_events(state: GatewayState, listener: Listener) -> AsyncIterator[StreamEvent]:
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


async def cancel_request(state: GatewayState, job_id: str, tenant: str) -> None:
    # Shielded: the handler's scope is already cancelled when the client has gone.
    with anyio.CancelScope(shield=True):
        assert state.store is not None
        try:
            await state.store.cancel(job_id, tenant, int(time.time() * 1000))
        except Exception:  # noqa: BLE001 - a failed cancel must not mask the disconnect
            log.warning("cancel_failed", job_id=job_id, exc_info=True)


def stop_listening(state: GatewayState, listener: Listener) -> None:
    assert state.streams is not None
    state.streams.local.forget(listener)


def count_completed(state: GatewayState, cls: RequestClass, shape: ResponseShape) -> None:
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
