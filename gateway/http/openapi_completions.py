"""The legacy completions part of the OpenAPI document (merged in by `gateway.http.openapi`), and
the written policy for vLLM's request extensions that both generation endpoints follow.

Shapes follow OpenAI's (`openai.types.Completion`), as `gateway.http.routes_completions` makes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.http.openapi_responses import schema_ref

__all__ = ["COMPLETION_SCHEMAS", "VLLM_EXTENSIONS_POLICY", "completion_paths"]

_NULLABLE_STRING: Final = {"type": ["string", "null"]}

# README's "vLLM request extensions" section, in short.
VLLM_EXTENSIONS_POLICY: Final = (
    "vLLM's request extensions: those mixgate implements are honoured on chat and legacy "
    "completions (`ignore_eos`, `min_tokens`, `top_k`, `min_p`, `repetition_penalty`, "
    "`stop_token_ids`, `stream_options.continuous_usage_stats`: the usage so far in every "
    "chunk); the others are refused with a 400 `unsupported_parameter` whose `param` names "
    "the field. None is accepted and ignored: every field that guidellm 0.8.1 and "
    "`vllm bench serve` 0.32 send is implemented."
)


def _choice(finish_reason: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["index", "text", "logprobs", "finish_reason"],
        "properties": {
            "index": {"type": "integer"},
            "text": {"type": "string"},
            "logprobs": {"type": "null"},
            "finish_reason": finish_reason,
        },
    }


_COMMON: Final[Mapping[str, Any]] = {
    "id": {"type": "string"},
    "object": {"const": "text_completion"},
    "created": {"type": "integer", "description": "Unix seconds."},
    "model": {"type": "string"},
    "system_fingerprint": _NULLABLE_STRING,
}

COMPLETION_SCHEMAS: Final[Mapping[str, Any]] = {
    "TextCompletion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            **_COMMON,
            "choices": {
                "type": "array",
                "items": _choice({"type": "string", "enum": ["stop", "length"]}),
            },
            "usage": schema_ref("Usage"),
        },
    },
    "TextCompletionChunk": {
        "type": "object",
        "description": "One SSE frame of a streamed completion: `data: {chunk}`.",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            **_COMMON,
            "choices": {
                "type": "array",
                "description": "One choice; empty in the final usage chunk.",
                "items": _choice({"type": ["string", "null"], "enum": ["stop", "length", None]}),
            },
            "usage": {
                "description": "With `include_usage`: null, or (continuous usage) the usage so "
                "far; the usage chunk's is the request's.",
                "anyOf": [schema_ref("Usage"), {"type": "null"}],
            },
        },
    },
}


def completion_paths(
    parameters: list[Mapping[str, Any]], errors: Mapping[str, Any]
) -> dict[str, Any]:
    """The /v1/completions path item; `parameters` and `errors` are chat's (the same rules)."""
    sse = (
        "With `stream: true`: frames `data: {TextCompletionChunk}\\n\\n`, "
        "then `data: [DONE]\\n\\n`."
    )
    return {
        "/v1/completions": {
            "post": {
                "operationId": "createCompletion",
                "summary": "Legacy text completion (interactive unless service_tier or the "
                "header say so)",
                "description": "The same classification, admission, queues, limits and stream "
                "format as chat completions; the prompt is text or token ids, one per "
                "request. " + VLLM_EXTENSIONS_POLICY,
                "parameters": list(parameters),
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": schema_ref("CompletionRequest")}},
                },
                "responses": {
                    "200": {
                        "description": "The completion, or its stream.",
                        "content": {
                            "application/json": {"schema": schema_ref("TextCompletion")},
                            "text/event-stream": {"schema": {"type": "string", "description": sse}},
                        },
                    },
                    **errors,
                },
            }
        }
    }
