"""The Files API, as OpenAI's: POST /v1/files (multipart, purpose=batch), GET /v1/files,
GET /v1/files/{id}, GET /v1/files/{id}/content, DELETE /v1/files/{id}.

An upload is checked for what a batch needs before it is stored: a size bound (Content-Length
is required and checked before anything is read), UTF-8 text, at least one and at most
`batch_max_lines` non-blank lines. The lines themselves are checked when a batch uses the file.
Another tenant's file is a 404.
"""

from __future__ import annotations

import time
from pathlib import PurePosixPath
from typing import Any, Final

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.admission.intake import authenticate
from gateway.batch.files import FileRecord, file_object, new_file_id
from gateway.batch.lines import count_lines
from gateway.batch.runtime import BatchRuntime
from gateway.http.errors import APIError
from gateway.http.state import GatewayState

__all__ = ["create_file", "delete_file", "file_content", "get_file", "list_files", "runtime"]

# The multipart envelope around the file: boundaries, headers and the purpose field.
_MULTIPART_OVERHEAD_BYTES: Final = 64 * 1024
_MAX_FILENAME_CHARS: Final = 256
MAX_FILES_PAGE: Final = 10_000


def runtime(state: GatewayState) -> BatchRuntime:
    if state.batch is None:
        raise APIError.service_unavailable("the file and batch stores are not connected yet")
    return state.batch


def _check_length(request: Request, max_bytes: int) -> None:
    declared = request.headers.get("content-length")
    if declared is None:
        raise APIError(411, "Uploads need a Content-Length header.", "invalid_request_error",
                       "length_required")  # fmt: skip
    if not declared.strip().isdigit():
        raise APIError.invalid_request("Invalid Content-Length header.", code="invalid_header")
    if int(declared) > max_bytes + _MULTIPART_OVERHEAD_BYTES:
        raise APIError.request_too_large(f"The file is too large: the limit is {max_bytes} bytes.")


def _check_content(data: bytes, max_bytes: int, max_lines: int) -> None:
    if len(data) > max_bytes:
        raise APIError.request_too_large(f"The file is too large: the limit is {max_bytes} bytes.")
    if not data.strip():
        raise APIError.invalid_request("The file is empty.", param="file", code="empty_file")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise APIError.invalid_request(
            f"The file is not UTF-8 text (invalid byte at offset {error.start}).",
            param="file",
            code="invalid_file",
        ) from None
    lines = count_lines(data)
    if lines > max_lines:
        raise APIError.invalid_request(
            f"The file has {lines} requests; a batch file may have at most {max_lines}.",
            param="file",
            code="too_many_requests_in_file",
        )


def _check_form_fields(form: FormData) -> None:
    # NOTE: as strict as the JSON bodies (and as the OpenAPI document says): an unknown or
    # repeated field is a 400, not silently ignored.
    for name in form:
        if name not in ("file", "purpose"):
            raise APIError.invalid_request(
                f"Unrecognized request argument supplied: {name[:64]}",
                param=name[:64],
                code="unknown_parameter",
            )
        if len(form.getlist(name)) > 1:
            raise APIError.invalid_request(f"'{name}' may be given only once.", param=name)


def _filename(upload: UploadFile) -> str:
    name = PurePosixPath((upload.filename or "upload.jsonl").replace("\\", "/")).name
    return (name or "upload.jsonl")[:_MAX_FILENAME_CHARS]


async def create_file(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    files = runtime(state).files
    settings = state.settings
    _check_length(request, settings.batch_max_file_bytes)
    async with request.form(max_files=1, max_fields=8) as form:
        _check_form_fields(form)
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise APIError.invalid_request(
                "purpose must be 'batch' (the only purpose this server stores).", param="purpose"
            )
        if not isinstance(upload, UploadFile):
            raise APIError.invalid_request(
                "Missing required parameter: 'file'.",
                param="file",
                code="missing_required_parameter",
            )
        data = await upload.read()
        name = _filename(upload)
    _check_content(data, settings.batch_max_file_bytes, settings.batch_max_lines)
    record = FileRecord(new_file_id(), principal.tenant, len(data), int(time.time()), name, "batch")
    await files.create(record, data)
    return JSONResponse(file_object(record))


async def _owned(request: Request) -> tuple[GatewayState, FileRecord]:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    file_id = request.path_params["file_id"]
    record = await runtime(state).files.get(file_id, principal.tenant)
    if record is None:
        raise APIError.not_found(f"No such File object: {file_id[:64]}", param="file_id")
    return state, record


async def get_file(request: Request) -> Response:
    _, record = await _owned(request)
    return JSONResponse(file_object(record))


async def file_content(request: Request) -> Response:
    state, record = await _owned(request)
    try:
        chunks = runtime(state).files.chunks(record)
    except FileNotFoundError:
        raise APIError.not_found("The file's content is gone.", param="file_id") from None
    return StreamingResponse(chunks, media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    state, record = await _owned(request)
    await runtime(state).files.delete(record)
    return JSONResponse({"id": record.file_id, "object": "file", "deleted": True})


def page_params(request: Request, max_limit: int, default: int) -> tuple[int, str | None]:
    try:
        limit = int(request.query_params.get("limit", str(default)))
    except ValueError:
        limit = 0
    if not 1 <= limit <= max_limit:
        raise APIError.invalid_request(f"limit must be an integer in 1..{max_limit}", param="limit")
    return limit, request.query_params.get("after")


def list_body(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


async def list_files(request: Request) -> Response:
    """Newest first; `purpose` filters the page (so a filtered page may hold fewer items)."""
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    limit, after = page_params(request, MAX_FILES_PAGE, 100)
    records = await runtime(state).files.list_page(principal.tenant, limit + 1, after)
    page = records[:limit]
    purpose = request.query_params.get("purpose")
    data = [file_object(r) for r in page if purpose is None or r.purpose == purpose]
    body = list_body(data, len(records) > limit)
    # The cursor is the page's last file even when the filter dropped it.
    body["last_id"] = page[-1].file_id if page else None
    return JSONResponse(body)
