"""The Files and Batch API part of the OpenAPI document (merged in by `gateway.http.openapi`).

Shapes follow OpenAI's (`openai.types.FileObject`, `openai.types.Batch`), as the routes
(`gateway.http.routes_files`, `gateway.http.routes_batches`) produce them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.http.openapi_responses import error_refs, json_response, schema_ref

__all__ = ["BATCH_SCHEMAS", "JSONL_MEDIA_TYPE", "batch_paths"]

JSONL_MEDIA_TYPE: Final = "application/jsonl"

_UNIX_S: Final = {"type": "integer", "description": "Unix seconds."}
_NULLABLE_UNIX_S: Final = {"type": ["integer", "null"], "description": "Unix seconds."}
_NULLABLE_STRING: Final = {"type": ["string", "null"]}
_BATCH_STATUSES: Final = [
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]


def _list_of(item: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["object", "data", "first_id", "last_id", "has_more"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": schema_ref(item)},
            "first_id": _NULLABLE_STRING,
            "last_id": _NULLABLE_STRING,
            "has_more": {"type": "boolean"},
        },
    }


BATCH_SCHEMAS: Final[Mapping[str, Any]] = {
    "FileObject": {
        "type": "object",
        "required": ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "file"},
            "bytes": {"type": "integer", "minimum": 0},
            "created_at": _UNIX_S,
            "filename": {"type": "string"},
            "purpose": {"type": "string", "enum": ["batch", "batch_output"]},
            "status": {"const": "processed"},
            "expires_at": _NULLABLE_UNIX_S,
            "status_details": _NULLABLE_STRING,
        },
    },
    "FileList": _list_of("FileObject"),
    "FileDeleted": {
        "type": "object",
        "required": ["id", "object", "deleted"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "file"},
            "deleted": {"const": True},
        },
    },
    "FileUpload": {
        "type": "object",
        "description": "Exactly these two parts, each once.",
        "required": ["file", "purpose"],
        "additionalProperties": False,
        "properties": {
            "file": {
                "type": "string",
                "format": "binary",
                "contentMediaType": JSONL_MEDIA_TYPE,
                "description": "A file part of UTF-8 JSONL text, not blank: one request per "
                "line (custom_id, method, url, body), at most the server's batch_max_lines "
                "lines and batch_max_file_bytes bytes. Other bytes are a 400 (`invalid_file`, "
                "`empty_file`, `too_many_requests_in_file`); the lines themselves are checked "
                "when a batch uses the file.",
            },
            "purpose": {"type": "string", "const": "batch"},
        },
    },
    "BatchError": {
        "type": "object",
        "properties": {
            "code": _NULLABLE_STRING,
            "message": _NULLABLE_STRING,
            "param": _NULLABLE_STRING,
            "line": {"type": ["integer", "null"], "description": "1-based input line."},
        },
    },
    "Batch": {
        "type": "object",
        "description": "A malformed input line is reported in `errors` (with its `line`) and "
        "in the error file; the valid lines still run.",
        "required": [
            "id",
            "object",
            "endpoint",
            "input_file_id",
            "completion_window",
            "status",
            "created_at",
            "request_counts",
        ],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "batch"},
            "endpoint": {"type": "string"},
            "model": _NULLABLE_STRING,
            "errors": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {
                            "object": {"const": "list"},
                            "data": {"type": "array", "items": schema_ref("BatchError")},
                        },
                    },
                    {"type": "null"},
                ]
            },
            "input_file_id": {"type": "string"},
            "completion_window": {"type": "string"},
            "status": {"type": "string", "enum": _BATCH_STATUSES},
            "output_file_id": _NULLABLE_STRING,
            "error_file_id": _NULLABLE_STRING,
            "created_at": _UNIX_S,
            "in_progress_at": _NULLABLE_UNIX_S,
            "expires_at": _NULLABLE_UNIX_S,
            "finalizing_at": _NULLABLE_UNIX_S,
            "completed_at": _NULLABLE_UNIX_S,
            "failed_at": _NULLABLE_UNIX_S,
            "expired_at": _NULLABLE_UNIX_S,
            "cancelling_at": _NULLABLE_UNIX_S,
            "cancelled_at": _NULLABLE_UNIX_S,
            "request_counts": {
                "type": "object",
                "required": ["total", "completed", "failed"],
                "properties": {
                    "total": {"type": "integer"},
                    "completed": {"type": "integer"},
                    "failed": {"type": "integer"},
                },
            },
            "metadata": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "string"},
            },
            "usage": {"type": "null"},
        },
    },
    "BatchList": _list_of("Batch"),
}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _list_params(max_limit: int, default: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "schema": {"type": "integer", "minimum": 1, "maximum": max_limit, "default": default},
        },
        {
            "name": "after",
            "in": "query",
            "required": False,
            "description": "An id: list the items after it (the previous page's `last_id`).",
            "schema": {"type": "string"},
        },
    ]


_CONFLICT: Final = {
    "description": "The batch is past the point where it can be cancelled.",
    "content": {"application/json": {"schema": schema_ref("Error")}},
}


def batch_paths() -> dict[str, Any]:
    return {
        "/v1/files": {
            "post": {
                "operationId": "createFile",
                "summary": "Upload a batch input file (multipart; purpose=batch)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "multipart/form-data": {
                            "schema": schema_ref("FileUpload"),
                            "encoding": {
                                "file": {"contentType": JSONL_MEDIA_TYPE},
                                "purpose": {"contentType": "text/plain"},
                            },
                        }
                    },
                },
                "responses": {
                    "200": json_response("Stored.", "FileObject"),
                    "411": {
                        "description": "No Content-Length.",
                        "content": {"application/json": {"schema": schema_ref("Error")}},
                    },
                    **error_refs("400", "401", "413", "429", "503"),
                },
            },
            "get": {
                "operationId": "listFiles",
                "summary": "This tenant's files, newest first",
                "parameters": [
                    *_list_params(10_000, 100),
                    {
                        "name": "purpose",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string"},
                    },
                ],  # fmt: skip
                "responses": {
                    "200": json_response("The files.", "FileList"),
                    **error_refs("400", "401", "429", "503"),
                },
            },
        },
        "/v1/files/{file_id}": {
            "parameters": [_path_param("file_id")],
            "get": {
                "operationId": "retrieveFile",
                "summary": "A file's metadata",
                "responses": {
                    "200": json_response("The file.", "FileObject"),
                    **error_refs("401", "404", "429", "503"),
                },
            },
            "delete": {
                "operationId": "deleteFile",
                "summary": "Delete a file",
                "responses": {
                    "200": json_response("Deleted.", "FileDeleted"),
                    **error_refs("401", "404", "429", "503"),
                },
            },
        },
        "/v1/files/{file_id}/content": {
            "parameters": [_path_param("file_id")],
            "get": {
                "operationId": "downloadFile",
                "summary": "A file's bytes (batch output and error files are JSONL)",
                "responses": {
                    "200": {
                        "description": "The bytes.",
                        "content": {"application/octet-stream": {"schema": {"type": "string"}}},
                    },
                    **error_refs("401", "404", "429", "503"),
                },
            },
        },
        "/v1/batches": {
            "post": {
                "operationId": "createBatch",
                "summary": "Run an uploaded file's lines as bulk jobs, within a window",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": schema_ref("BatchCreateRequest")}},
                },
                "responses": {
                    "200": json_response("Created (or failed: no valid line).", "Batch"),
                    **error_refs("400", "401", "403", "404", "413", "429", "503"),
                },
            },
            "get": {
                "operationId": "listBatches",
                "summary": "This tenant's batches, newest first",
                "parameters": _list_params(100, 20),
                "responses": {
                    "200": json_response("The batches.", "BatchList"),
                    **error_refs("400", "401", "429", "503"),
                },
            },
        },
        "/v1/batches/{batch_id}": {
            "parameters": [_path_param("batch_id")],
            "get": {
                "operationId": "retrieveBatch",
                "summary": "A batch's status and counts",
                "responses": {
                    "200": json_response("The batch.", "Batch"),
                    **error_refs("401", "404", "429", "503"),
                },
            },
        },
        "/v1/batches/{batch_id}/cancel": {
            "parameters": [_path_param("batch_id")],
            "post": {
                "operationId": "cancelBatch",
                "summary": "Cancel: finished lines are kept, the rest become error lines",
                "responses": {
                    "200": json_response("Cancelling (or already cancelled).", "Batch"),
                    "409": _CONFLICT,
                    **error_refs("401", "404", "429", "503"),
                },
            },
        },
    }
