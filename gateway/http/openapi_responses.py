"""The OpenAPI document's hand-written parts for what the chat, job and operational routes
return: response schemas, the shared error responses, and references to them.

Request bodies come from the pydantic models (gateway/http/openapi.py); responses are written
out here in the shapes the routes produce (tests/gateway/test_openapi_document.py checks them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "ERROR_RESPONSES",
    "RESPONSE_SCHEMAS",
    "error_refs",
    "json_response",
    "schema_ref",
]

_SCHEMAS: Final = "#/components/schemas/"
_RESPONSES: Final = "#/components/responses/"


def schema_ref(name: str) -> dict[str, str]:
    return {"$ref": _SCHEMAS + name}


def json_response(description: str, schema_name: str) -> dict[str, Any]:
    """A response whose JSON body is the named component schema."""
    return {
        "description": description,
        "content": {"application/json": {"schema": schema_ref(schema_name)}},
    }


# ---- hand-written schemas for what the routes return ----------------------------------------

_NULLABLE_STRING: Final = {"type": ["string", "null"]}
_NULLABLE_UNIX_S: Final = {"type": ["number", "null"], "description": "Unix seconds."}

RESPONSE_SCHEMAS: Final[Mapping[str, Any]] = {
    "ErrorObject": {
        "type": "object",
        "required": ["message", "type", "code", "param"],
        "properties": {
            "message": {"type": "string"},
            "type": {
                "type": "string",
                "examples": ["invalid_request_error", "authentication_error", "rate_limit_error"],
            },
            "code": _NULLABLE_STRING,
            "param": {**_NULLABLE_STRING, "description": "The field path or header at fault."},
        },
    },
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": schema_ref("ErrorObject")},
    },
    "Usage": {
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": {"type": "integer"},
            "completion_tokens": {"type": "integer"},
            "total_tokens": {"type": "integer"},
        },
    },
    "ChatCompletion": {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion"},
            "created": {"type": "integer", "description": "Unix seconds."},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "message", "logprobs", "finish_reason"],
                    "properties": {
                        "index": {"type": "integer"},
                        "message": {
                            "type": "object",
                            "required": ["role", "content", "refusal"],
                            "properties": {
                                "role": {"const": "assistant"},
                                "content": _NULLABLE_STRING,
                                "refusal": {"type": "null"},
                            },
                        },
                        "logprobs": {"type": "null"},
                        "finish_reason": {"type": "string", "enum": ["stop", "length"]},
                    },
                },
            },
            "usage": schema_ref("Usage"),
            "service_tier": _NULLABLE_STRING,
            "system_fingerprint": _NULLABLE_STRING,
        },
    },
    "ChatCompletionChunk": {
        "type": "object",
        "description": "One SSE frame of a streamed completion: `data: {chunk}`.",
        "required": ["id", "object", "created", "model", "choices"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "chat.completion.chunk"},
            "created": {"type": "integer", "description": "Unix seconds."},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "description": "One choice; empty in the final usage chunk.",
                "items": {
                    "type": "object",
                    "required": ["index", "delta", "logprobs", "finish_reason"],
                    "properties": {
                        "index": {"type": "integer"},
                        "delta": {
                            "type": "object",
                            "properties": {
                                "role": {"const": "assistant"},
                                "content": {"type": "string"},
                            },
                        },
                        "logprobs": {"type": "null"},
                        "finish_reason": {
                            "type": ["string", "null"],
                            "enum": ["stop", "length", None],
                        },
                    },
                },
            },
            "usage": {"anyOf": [schema_ref("Usage"), {"type": "null"}]},
            "service_tier": _NULLABLE_STRING,
            "system_fingerprint": _NULLABLE_STRING,
        },
    },
    # NOTE: written to match routes_jobs.job_object: times are float Unix seconds (ms / 1000)
    # and the finished completion is under "response".
    "Job": {
        "type": "object",
        "required": ["id", "object", "status", "class", "created_at"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "job"},
            "status": {
                "type": "string",
                "enum": ["queued", "running", "completed", "failed", "cancelled", "expired"],
            },
            "class": {"type": "string", "enum": ["interactive", "bulk"]},
            "model": {"type": "string"},
            "custom_id": _NULLABLE_STRING,
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
            "created_at": {"type": "number", "description": "Unix seconds."},
            "deadline_at": _NULLABLE_UNIX_S,
            "started_at": _NULLABLE_UNIX_S,
            "finished_at": _NULLABLE_UNIX_S,
            "attempts": {"type": "integer", "minimum": 0},
            "response": {
                "description": "The chat.completion, once the job has completed.",
                "anyOf": [schema_ref("ChatCompletion"), {"type": "null"}],
            },
            "timings": {
                "description": "Where the job's time went, once it has completed.",
                "type": ["object", "null"],
            },
            "error": {
                "description": "Why the job failed.",
                "anyOf": [schema_ref("JobError"), {"type": "null"}],
            },
            "cancel": {
                "description": "DELETE only: `cancelled`, `cancelling` (it was running and "
                "stops shortly), or the terminal status it already had.",
                "type": "string",
            },
        },
    },
    "JobError": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
    },
    "JobList": {
        "type": "object",
        "required": ["object", "data", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": schema_ref("Job")},
            "first_id": _NULLABLE_STRING,
            "last_id": _NULLABLE_STRING,
            "has_more": {"type": "boolean"},
        },
    },
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer", "description": "Unix seconds."},
            "owned_by": {"type": "string"},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": schema_ref("Model")},
        },
    },
    "Envelope": {
        "type": "object",
        "description": "The operating envelope in force: limits derived from load sweeps.",
        "additionalProperties": True,
    },
    "EngineStep": {
        "type": "object",
        "required": ["step_index", "started_s", "duration_s", "tokens", "running", "waiting"],
        "properties": {
            "step_index": {"type": "integer"},
            "started_s": {
                "type": "number",
                "description": "The host's monotonic clock, as a chat's handed_at_s and "
                "first_token_at_s timings (x-mixgate-timings: 1).",
            },
            "duration_s": {"type": "number"},
            "tokens": {
                "type": "object",
                "description": 'Tokens by class, then kind: {"bulk": {"prefill": 128}}.',
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                },
            },
            "running": {"type": "object", "additionalProperties": {"type": "integer"}},
            "waiting": {"type": "object", "additionalProperties": {"type": "integer"}},
            "kv_usage": {"type": "number"},
            "preemptions": {"type": "integer"},
        },
    },
    "EngineStepList": {
        "type": "object",
        "required": ["object", "clock", "data", "first_step", "last_step"],
        "properties": {
            "object": {"type": "string", "enum": ["list"]},
            "clock": {"type": "string", "enum": ["monotonic"]},
            "data": {"type": "array", "items": {"$ref": "#/components/schemas/EngineStep"}},
            "first_step": {
                "type": ["integer", "null"],
                "description": "The oldest step the gateway still keeps.",
            },
            "last_step": {"type": ["integer", "null"]},
        },
    },
    "Readiness": {
        "type": "object",
        "required": ["ready"],
        "properties": {
            "ready": {"type": "boolean"},
            "reasons": {"type": "array", "items": {"type": "string"}},
        },
    },
    "Status": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string"}},
        "additionalProperties": True,
    },
}

_ERROR_CONTENT: Final = {"application/json": {"schema": schema_ref("Error")}}
_RETRY_AFTER: Final = {"$ref": "#/components/headers/RetryAfter"}

ERROR_RESPONSES: Final[Mapping[str, Any]] = {
    "BadRequest": {
        "description": "Invalid request (`param` names the field).",
        "content": _ERROR_CONTENT,
    },
    "Unauthorized": {"description": "Missing or invalid API key.", "content": _ERROR_CONTENT},
    "Forbidden": {"description": "The key may not use this class.", "content": _ERROR_CONTENT},
    "NotFound": {"description": "Unknown, or another tenant's.", "content": _ERROR_CONTENT},
    "RequestTimeout": {
        "description": "The body did not arrive within the read timeout.",
        "content": _ERROR_CONTENT,
    },
    "PayloadTooLarge": {"description": "Body or prompt too long.", "content": _ERROR_CONTENT},
    "TooManyRequests": {
        "description": "Rate limit, full class queue, or a deadline that cannot be met.",
        "headers": {"Retry-After": _RETRY_AFTER},
        "content": _ERROR_CONTENT,
    },
    "ServiceUnavailable": {
        "description": "Not ready, draining, or the queue store is down.",
        "content": _ERROR_CONTENT,
    },
}

_STATUS_RESPONSE_NAMES: Final[Mapping[str, str]] = {
    "400": "BadRequest",
    "401": "Unauthorized",
    "403": "Forbidden",
    "404": "NotFound",
    "408": "RequestTimeout",
    "413": "PayloadTooLarge",
    "429": "TooManyRequests",
    "503": "ServiceUnavailable",
}


def error_refs(*statuses: str) -> dict[str, Any]:
    """The shared error responses for these statuses, by reference."""
    return {status: {"$ref": _RESPONSES + _STATUS_RESPONSE_NAMES[status]} for status in statuses}
