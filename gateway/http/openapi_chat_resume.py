"""The OpenAPI path item of a chat stream's resume (`gateway.http.routes_chat_resume`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RESUME_PATH = "/v1/chat/completions/{completion_id}/stream"

_SSE = (
    "The events after `Last-Event-ID` (all of them, role chunk first, without it), then the "
    "live stream: frames `id: <event id>\\ndata: {ChatCompletionChunk}\\n\\n`, then "
    "`data: [DONE]\\n\\n`. A stream that ended with an error (e.g. cancelled after the grace) "
    'replays its frames, then `data: {"error": {...}}`.'
)


def resume_paths(errors: Mapping[str, Any]) -> dict[str, Any]:
    """`errors`: the shared error responses by status (400, 401, 404, 429, 503 are used)."""
    return {
        RESUME_PATH: {
            "parameters": [
                {
                    "name": "completion_id",
                    "in": "path",
                    "required": True,
                    "description": "The chat completion's id (`chatcmpl-...`, every chunk's `id`).",
                    "schema": {"type": "string"},
                }
            ],
            "get": {
                "operationId": "resumeChatCompletionStream",
                "summary": "Resume a chat stream after a disconnect (any replica)",
                "description": "For a chat created with `stream: true` and "
                "`stream_options.resumable: true`. Its client may leave without cancelling "
                "it: it keeps generating for the server's `MIXGATE_STREAM_RESUME_GRACE_S` "
                "(30 s by default) and is cancelled then unless some client resumes it here. "
                "A stream that ended is replayed while the server keeps it "
                "(`MIXGATE_STREAM_TTL_S`). 404 `chat_completion_not_found`: unknown, or "
                "another tenant's; `stream_not_resumable`: not created resumable; "
                "`stream_expired`: no longer kept, or read to its end by its first client.",
                "parameters": [
                    {
                        "name": "Last-Event-ID",
                        "in": "header",
                        "required": False,
                        "description": "The `id:` of the last frame the client received "
                        "(`<n>-<n>`); absent: replay from the start. Malformed: 400 "
                        "`invalid_value`.",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,20}-[0-9]{1,20}$"},
                    }
                ],
                "responses": {
                    "200": {
                        "description": "The rest of the stream.",
                        "content": {
                            "text/event-stream": {"schema": {"type": "string", "description": _SSE}}
                        },
                    },
                    **{s: errors[s] for s in ("400", "401", "404", "429", "503") if s in errors},
                },
            },
        }
    }
