"""The OpenAPI 3.1 document served at /openapi.json.

Request bodies come from the pydantic models, so the document cannot drift from what the
gateway validates; responses are written out here, in the shapes the routes produce.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from pydantic import BaseModel

from gateway.batch.schemas import BatchCreateRequest
from gateway.http.openapi_batch import BATCH_SCHEMAS, batch_paths
from gateway.http.openapi_chat_resume import resume_paths
from gateway.http.openapi_completions import (
    COMPLETION_SCHEMAS,
    VLLM_EXTENSIONS_POLICY,
    completion_paths,
)
from gateway.http.openapi_responses import (
    ERROR_RESPONSES,
    RESPONSE_SCHEMAS,
    error_refs,
    json_response,
    schema_ref,
)
from gateway.http.schemas_chat import ChatCompletionRequest
from gateway.http.schemas_completions import CompletionRequest
from gateway.http.schemas_jobs import JobCreateRequest
from policies.classify import CLASS_HEADER

__all__ = ["DOCUMENTED_OPERATIONS", "build_openapi", "hoist_defs"]

_SCHEMAS: Final = "#/components/schemas/"

_DESCRIPTION: Final = (
    "OpenAI-compatible gateway serving interactive chat (SSE) and bulk jobs (REST) from one "
    'engine. Errors are `{"error": {"message", "type", "code", "param"}}`; a 429 '
    "carries `Retry-After` (seconds), and a 405 an `Allow` header naming the path's methods. "
    "Every operation that needs an API key may answer 429 when the key's rate limit is spent. "
    + VLLM_EXTENSIONS_POLICY
)


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: (
                _SCHEMAS + value.removeprefix("#/$defs/")
                if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/")
                else _rewrite_refs(value)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(item) for item in node]
    return node


def hoist_defs(schema: Mapping[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """``schema`` without its ``$defs``: they move into ``components`` (OpenAPI's
    ``components/schemas``) and every ``#/$defs/X`` ref becomes ``#/components/schemas/X``.

    Two models may share a definition (both request bodies use ChatMessage); a name defined
    twice must be defined the same way, or the document would silently describe one of them
    wrongly.
    """
    body = dict(copy.deepcopy(schema))
    for name, definition in body.pop("$defs", {}).items():
        hoisted = _rewrite_refs(definition)
        if name in components and components[name] != hoisted:
            raise ValueError(f"two different schemas are both named {name!r}")
        components[name] = hoisted
    result: dict[str, Any] = _rewrite_refs(body)
    return result


def _model_schema(model: type[BaseModel], components: dict[str, Any]) -> None:
    components[model.__name__] = hoist_defs(model.model_json_schema(), components)


# ---- operations -----------------------------------------------------------------------------


_CLASS_HEADER_PARAM: Final = {
    "name": CLASS_HEADER,
    "in": "header",
    "required": False,
    "description": "Run the request in this class (overrides the endpoint default and "
    "`service_tier`); the key must allow it.",
    "schema": {"type": "string", "enum": ["interactive", "bulk"]},
}
_JOB_ID_PARAM: Final = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
_LIST_PARAMS: Final = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
    },
    {
        "name": "after",
        "in": "query",
        "required": False,
        "description": "A job id: list the jobs after it (the previous page's `last_id`).",
        "schema": {"type": "string"},
    },
]
_AFTER_STEP_PARAM: Final[dict[str, Any]] = {
    "name": "after_step",
    "in": "query",
    "required": False,
    "description": "A step_index already read: list only the steps after it.",
    "schema": {"type": "integer", "minimum": -1, "default": -1},
}
_PUBLIC: Final[list[Any]] = []  # `security: []`: no API key needed
# 404: an unknown model; 408: a body that arrives too slowly (settings.body_read_timeout_s).
_SUBMIT_ERRORS: Final = ("400", "401", "403", "404", "408", "413", "429", "503")


def _paths() -> dict[str, Any]:
    sse = (
        "With `stream: true`: frames `data: {ChatCompletionChunk}\\n\\n`, then "
        "`data: [DONE]\\n\\n`. With `stream_options.resumable: true` each event's frames "
        "also carry its id (`id: <event id>\\n`; the role chunk has none), and a client that "
        "leaves may resume with the last id it received: "
        "`GET /v1/chat/completions/{completion_id}/stream`."
    )
    return {
        "/v1/chat/completions": {
            "post": {
                "operationId": "createChatCompletion",
                "summary": "Chat completion (interactive unless service_tier or the header say so)",
                "parameters": [_CLASS_HEADER_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": schema_ref("ChatCompletionRequest")}
                    },
                },
                "responses": {
                    "200": {
                        "description": "The completion, or its stream.",
                        "content": {
                            "application/json": {"schema": schema_ref("ChatCompletion")},
                            "text/event-stream": {"schema": {"type": "string", "description": sse}},
                        },
                    },
                    **error_refs(*_SUBMIT_ERRORS),
                },
            }
        },
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "summary": "The models this gateway serves",
                "responses": {
                    "200": json_response("The models.", "ModelList"),
                    **error_refs("401", "429"),
                },
            }
        },
        "/v1/jobs": {
            "post": {
                "operationId": "createJob",
                "summary": "Submit a bulk job (accepted once it is durable in the queue)",
                "parameters": [_CLASS_HEADER_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": schema_ref("JobCreateRequest")}},
                },
                "responses": {
                    "202": {
                        **json_response("Queued.", "Job"),
                        "headers": {
                            "Location": {
                                "description": "The job's URL: /v1/jobs/{job_id}.",
                                "schema": {"type": "string"},
                            }
                        },
                    },
                    **error_refs(*_SUBMIT_ERRORS),
                },
            },
            "get": {
                "operationId": "listJobs",
                "summary": "This tenant's jobs, a page at a time",
                "parameters": _LIST_PARAMS,
                "responses": {
                    "200": json_response("The jobs.", "JobList"),
                    **error_refs("400", "401", "429", "503"),
                },
            },
        },
        "/v1/jobs/{job_id}": {
            "parameters": [_JOB_ID_PARAM],
            "get": {
                "operationId": "getJob",
                "summary": "A job's status, and its result once completed",
                "responses": {
                    "200": json_response("The job.", "Job"),
                    **error_refs("401", "404", "429", "503"),
                },
            },
            "delete": {
                "operationId": "cancelJob",
                "summary": "Cancel a job (`cancel` in the reply says what happened)",
                "responses": {
                    "200": json_response("The job.", "Job"),
                    **error_refs("401", "404", "429", "503"),
                },
            },
        },
        "/v1/envelope": {
            "get": {
                "operationId": "getEnvelope",
                "summary": "The operating envelope in force",
                "security": _PUBLIC,
                "responses": {"200": json_response("The envelope.", "Envelope")},
            }
        },
        "/v1/engine/steps": {
            "get": {
                "operationId": "listEngineSteps",
                "summary": "The engine's recent steps: when each ran and the tokens it carried",
                "security": _PUBLIC,
                "parameters": [_AFTER_STEP_PARAM],
                "responses": {
                    "200": json_response("The steps, oldest first.", "EngineStepList"),
                    **error_refs("400"),
                },
            }
        },
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness as vLLM answers it: 200 with an empty body",
                "security": _PUBLIC,
                "responses": {"200": {"description": "Alive (no body)."}},
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: the process serves HTTP",
                "security": _PUBLIC,
                "responses": {"200": json_response("Alive.", "Status")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: engine loaded, queue store reachable, not draining",
                "security": _PUBLIC,
                "responses": {
                    "200": json_response("Ready.", "Readiness"),
                    "503": json_response("Not ready, with the reasons.", "Readiness"),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (a `class` label wherever it applies)",
                "security": _PUBLIC,
                "responses": {
                    "200": {
                        "description": "Prometheus text exposition format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": _PUBLIC,
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1.",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }


def _all_paths() -> dict[str, Any]:
    completions = completion_paths([_CLASS_HEADER_PARAM], error_refs(*_SUBMIT_ERRORS))
    resume = resume_paths(error_refs("400", "401", "404", "429", "503"))
    return {**_paths(), **resume, **completions, **batch_paths()}


_METHODS: Final = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})

# (METHOD, path) of every documented operation, so an app test can check that each of its
# routes is documented and each documented route exists.
DOCUMENTED_OPERATIONS: Final = frozenset(
    (method.upper(), path)
    for path, item in _all_paths().items()
    for method in item
    if method in _METHODS
)


def build_openapi(
    description: str | None = None, *, title: str = "mixgate", version: str = "0.1.0"
) -> dict[str, Any]:
    """The whole document; build it once at startup and serve the same dict."""
    schemas: dict[str, Any] = {}
    _model_schema(ChatCompletionRequest, schemas)
    _model_schema(CompletionRequest, schemas)
    _model_schema(JobCreateRequest, schemas)
    _model_schema(BatchCreateRequest, schemas)
    for name, schema in {**RESPONSE_SCHEMAS, **COMPLETION_SCHEMAS, **BATCH_SCHEMAS}.items():
        if name in schemas:  # pragma: no cover - a programming error caught by the tests
            raise ValueError(f"schema name {name!r} is used twice")
        schemas[name] = copy.deepcopy(schema)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version, "description": description or _DESCRIPTION},
        "security": [{"bearerAuth": []}],
        "paths": _all_paths(),
        "components": {
            "schemas": schemas,
            "responses": copy.deepcopy(dict(ERROR_RESPONSES)),
            "headers": {
                "RetryAfter": {
                    "description": "Seconds to wait before retrying (an integer).",
                    "schema": {"type": "integer", "minimum": 1},
                }
            },
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "An API key."}
            },
        },
    }
