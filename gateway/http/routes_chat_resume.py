"""GET /v1/chat/completions/{completion_id}/stream: resume a chat stream after a disconnect.

A chat asked for with `stream_options.resumable: true` is not cancelled when its client
leaves: its stream moves to Redis (`gateway.dispatch.job_run`, handover) and keeps going
for `stream_resume_grace_s` (`gateway.dispatch.resume_grace`). Any replica on the same Redis
answers this route: it replays the events after the client's `Last-Event-ID` (every frame of
the first stream carried its event's id), then follows the live stream to `data: [DONE]`.
Without the header the stream is replayed from its start (role chunk included). After the
end, what Redis keeps (`stream_ttl_s`) is replayed.

The name follows SSE's own resume (the `Last-Event-ID` header EventSource sends) on the path
of OpenAI's stored chat completion (`GET /v1/chat/completions/{completion_id}`); OpenAI's
Responses API resumes a `background` response with `GET /v1/responses/{id}?stream=true` and
`starting_after` the same way.

Errors have OpenAI's shape: 400 `invalid_value` (param `Last-Event-ID`) for an id that is not
one this server hands out; 404 `chat_completion_not_found` for an unknown id or another
tenant's (never revealed), `stream_not_resumable` for a chat that did not ask to be, and
`stream_expired` for one whose stream is no longer kept (or that was read to its end while
its client stayed: nothing is written to Redis then).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.intake import Admitted, authenticate
from gateway.dispatch.local_delivery import RESUMABLE_KEY
from gateway.dispatch.stream_event import parse_event_id
from gateway.dispatch.token_stream import TokenStreams
from gateway.http.errors import APIError
from gateway.http.routes_chat import ChatShape
from gateway.http.sse import TIMINGS_HEADER, SseAnswer, sse_response
from gateway.http.state import GatewayState
from gateway.queue import JobStatus
from gateway.queue.payload import JobPayload
from gateway.runtime.redis_health import require_redis

LAST_EVENT_ID = "last-event-id"
_CHAT_ID_PREFIX = "chatcmpl-"


def _after(request: Request) -> str:
    """Where the replay starts: after the client's Last-Event-ID, or at the stream's start."""
    raw = request.headers.get(LAST_EVENT_ID, "").strip()
    if not raw:
        return "0-0"
    if parse_event_id(raw) is None:
        raise APIError.invalid_request(
            "Last-Event-ID must be the id of an event of this stream (`<n>-<n>`, as its "
            "frames' `id:` lines carry it).",
            param="Last-Event-ID",
        )
    return raw


def _not_found() -> APIError:
    return APIError.not_found(
        "No chat completion with that id.", code="chat_completion_not_found", param="completion_id"
    )


async def resume_chat_stream(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    require_redis(state)
    principal = authenticate(request, state)
    job_id = request.path_params["completion_id"]
    store, streams = state.store, state.streams
    assert store is not None and streams is not None
    # Only a chat's id names a chat stream (a job's or a completion's is not found here).
    is_chat = job_id.startswith(_CHAT_ID_PREFIX)
    record = await store.get_job(job_id, principal.tenant) if is_chat else None
    if record is None:
        raise _not_found()
    # NOTE: after the id is known, so a bad header never tells whether an id exists.
    after = _after(request)
    payload = JobPayload.from_json(record.request_json)
    if not (payload.stream and payload.extra.get(RESUMABLE_KEY)):
        raise APIError.not_found(
            "This chat completion's stream is not resumable: ask for it with "
            "`stream_options.resumable: true`.",
            code="stream_not_resumable",
            param="completion_id",
        )
    answer = SseAnswer(
        state,
        Admitted(job_id, record.request_class, payload, record.enqueue_ms, record.deadline_ms or 0),
        streams.local.follow(job_id, after),
        principal.tenant,
        ChatShape(),
    )
    answer.send_first_chunk = after == "0-0"
    answer.with_timings = request.headers.get(TIMINGS_HEADER) == "1"
    if await _ended_before(streams, job_id, after, record.status):
        # The client has had the last event (its id is the one it sent): nothing is left.
        return Response(b"data: [DONE]\n\n", media_type="text/event-stream")
    epoch = await store.resume_reader(job_id, principal.tenant)
    if epoch is None:  # removed meanwhile (retention)
        raise _not_found()
    answer.reader_epoch = epoch
    # NOTE: only a first handler on this replica is told; one on another replica whose
    # server has not noticed its client leave keeps the stream in-process until it does.
    streams.local.take_over(job_id)
    return sse_response(answer, {})


async def _ended_before(streams: TokenStreams, job_id: str, after: str, status: JobStatus) -> bool:
    """True when the stream's last event is at or before `after`; 404 when the stream of an
    ended job is not kept. A running job's stream may not exist yet (its attempt hands it
    over to Redis at its next event): the reader then waits for it."""
    tail = await streams.tail(job_id)
    if not tail.exists:
        if status in (JobStatus.QUEUED, JobStatus.RUNNING):
            return False
        raise APIError.not_found(
            "This chat completion's stream is no longer kept (it ended more than the "
            "server's stream_ttl_s ago, or it was read to its end).",
            code="stream_expired",
            param="completion_id",
        )
    last = tail.last
    if last is None or not last.is_last:
        return False
    last_id, after_id = parse_event_id(last.entry_id), parse_event_id(after)
    return last_id is not None and after_id is not None and last_id <= after_id
