"""POST /v1/chat/completions: OpenAI-compatible, streamed over SSE or answered as one body.

The request is queued like any other (so any replica may run it). Its handler registers as the job's
local listener right after admit: when this replica's dispatcher runs the job, the tokens come
in-process; when another replica runs it, over the request's Redis stream
(`gateway.dispatch.local_delivery`). A client that goes away cancels the request: the replica
running it aborts it in its engine, which frees its KV blocks. The path after parsing is shared with
legacy completions (`gateway.http.generation_stream`). A stream asked for with
`stream_options.resumable` is not cancelled when its client leaves: the client may resume it
(`gateway.http.routes_chat_resume`) within the grace time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.intake import Admitted, build_payload
from gateway.http.generation_stream import accept_request, admit_and_answer
from gateway.http.schemas import (
    chat_chunk_body,
    chat_completion_body,
    content_delta,
    parse_chat_request,
    role_delta,
)
from gateway.http.schemas_chat import ChatStreamOptions


class ChatShape:
    """`chat.completion` and `chat.completion.chunk`, in OpenAI's stream order."""

    endpoint = "chat"

    def first_chunk(self, admitted: Admitted) -> dict[str, Any] | None:
        return self._chunk(admitted, role_delta(), None)

    def text_chunk(self, admitted: Admitted, text: str) -> dict[str, Any]:
        return self._chunk(admitted, content_delta(text), None)

    def finish_chunk(self, admitted: Admitted, finish_reason: str) -> dict[str, Any]:
        return self._chunk(admitted, {}, finish_reason)

    def usage_chunk(self, admitted: Admitted, usage: Mapping[str, int]) -> dict[str, Any]:
        payload = admitted.payload
        return chat_chunk_body(
            admitted.job_id, payload.created_s, payload.model, {}, None, usage=usage
        )

    def whole_body(
        self, admitted: Admitted, text: str, finish_reason: str, usage: Mapping[str, int]
    ) -> dict[str, Any]:
        payload = admitted.payload
        return chat_completion_body(
            admitted.job_id, payload.created_s, payload.model, text, finish_reason, usage
        )

    @staticmethod
    def _chunk(
        admitted: Admitted, delta: dict[str, str], finish_reason: str | None
    ) -> dict[str, Any]:
        payload = admitted.payload
        return chat_chunk_body(
            admitted.job_id, payload.created_s, payload.model, delta, finish_reason
        )


async def chat_completions(request: Request) -> Response:
    accepted = await accept_request(request, parse_chat_request)
    payload = build_payload(accepted.state, accepted.body, accepted.request_class)
    options = accepted.body.stream_options
    resumable = isinstance(options, ChatStreamOptions) and bool(options.resumable)
    return await admit_and_answer(
        request, accepted, payload, ChatShape(), id_prefix="chatcmpl-", resumable=resumable
    )
