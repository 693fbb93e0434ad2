"""The Batch API, as OpenAI's: POST /v1/batches, GET /v1/batches/{id},
POST /v1/batches/{id}/cancel, GET /v1/batches (newest first, `after`/`limit` paging).

Creation reads the input file and checks every line at once (`gateway.batch.lines`,
`gateway.batch.prepare`): malformed lines are reported per line and the valid ones run. It then
asks whether the whole batch can finish within its window given the queues ahead
(`gateway.batch.feasibility`) and refuses it with a 429 ``deadline_unmeetable`` when it cannot.
An accepted batch is stored in Redis and the supervisors (`gateway.batch.supervisor`) run it.
Another tenant's batch is a 404.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admission.intake import authenticate, request_class, require_ready
from gateway.batch.feasibility import BatchWork, predict_batch
from gateway.batch.lines import parse_input_lines
from gateway.batch.prepare import PreparedBatch, prepare_lines
from gateway.batch.records import BatchRecord, BatchStatus, StopReason, batch_object
from gateway.batch.result_lines import malformed_line
from gateway.batch.schemas import BatchCreateRequest, parse_batch_request
from gateway.http import routes_files
from gateway.http.body import read_json_body
from gateway.http.errors import APIError
from gateway.http.routes_files import list_body, page_params, runtime
from gateway.http.state import GatewayState
from policies.admission import QueueState
from policies.request_class import RequestClass
from policies.scheduling_policy import SchedulingPolicy

__all__ = [
    "batch_routes",
    "cancel_batch",
    "cancel_owned",
    "create_batch",
    "get_batch",
    "list_batches",
]

# `errors.data` lists at most this many malformed lines; the error file has every one.
MAX_REPORTED_ERRORS: Final = 1000
MAX_BATCHES_PAGE: Final = 100


def _prepare(state: GatewayState, batch_id: str, raw: bytes, endpoint: str) -> PreparedBatch:
    return prepare_lines(state, batch_id, parse_input_lines(raw, endpoint))


async def _refuse_if_too_late(state: GatewayState, work: BatchWork, window_s: float) -> None:
    if not SchedulingPolicy(state.settings.policy).admits_by_deadline:
        return
    assert state.store is not None and state.admission is not None
    depths = await state.store.depths()
    queues = {
        c: QueueState(
            max(0, depths[c].jobs),
            max(0, depths[c].queued_tokens),
            max(1, state.envelope.queue_limit(c)),
        )  # fmt: skip
        for c in RequestClass
    }
    prediction = predict_batch(
        work, window_s, queues, state.admission.rates(), state.admission.config
    )
    if not prediction.fits:
        raise APIError.deadline_unmeetable(
            prediction.refusal_message(), prediction.retry_after_s, param="completion_window"
        )


def _fields(
    state: GatewayState, tenant: str, batch_id: str, body: BatchCreateRequest,
    prepared: PreparedBatch, now_s: int,
) -> dict[str, str | int]:  # fmt: skip
    running = bool(prepared.todo)
    errors = [e.batch_error() for e in prepared.errors[:MAX_REPORTED_ERRORS]]
    return {
        "id": batch_id,
        "tenant": tenant,
        "status": (BatchStatus.VALIDATING if running else BatchStatus.FAILED).value,
        "stop": StopReason.NONE.value,
        "endpoint": body.endpoint,
        "input_file_id": body.input_file_id,
        "completion_window": body.completion_window,
        "model": state.model_name,
        "metadata": json.dumps(body.metadata or {}),
        "created_at": now_s,
        "expires_at": now_s + math.ceil(body.window_s),
        "failed_at": 0 if running else now_s,
        "total": len(prepared.todo) + len(prepared.errors),
        "completed": 0,
        "failed": len(prepared.errors) if running else 0,
        "errors": json.dumps(errors) if errors else "",
    }


async def create_batch(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    require_ready(state)
    principal = authenticate(request, state)
    request_class(request, RequestClass.BULK, None, principal)  # 403 when bulk is not allowed
    body = parse_batch_request(await read_json_body(request, state.settings.max_body_bytes))
    rt = runtime(state)
    source = await rt.files.get(body.input_file_id, principal.tenant)
    if source is None:
        raise APIError.not_found(
            f"No such File object: {body.input_file_id[:64]}", param="input_file_id"
        )
    if source.purpose != "batch":
        raise APIError.invalid_request(
            "The input file must have been uploaded with purpose 'batch'.", param="input_file_id"
        )
    raw = await rt.files.read(source)
    batch_id = "batch_" + secrets.token_hex(12)
    prepared = await asyncio.to_thread(_prepare, state, batch_id, raw, body.endpoint)
    if prepared.todo:
        await _refuse_if_too_late(state, prepared.work, body.window_s)
    now_ms = int(time.time() * 1000)
    fields = _fields(state, principal.tenant, batch_id, body, prepared, now_ms // 1000)
    running = bool(prepared.todo)
    # A failed batch (no valid line) has no error file: its `errors` say everything.
    error_lines = {e.line: malformed_line(batch_id, e) for e in prepared.errors} if running else {}
    await rt.batches.create(
        fields, [t.to_json() for t in prepared.todo], error_lines, now_ms, active=running
    )
    state.metrics.requests.labels(RequestClass.BULK.value, "batches", "admitted").inc()
    return JSONResponse(batch_object(await _owned(state, batch_id, principal.tenant)))


async def _owned(state: GatewayState, batch_id: str, tenant: str) -> BatchRecord:
    record = await runtime(state).batches.get(batch_id, tenant)
    if record is None:
        raise APIError.not_found(f"No such Batch object: {batch_id[:64]}", param="batch_id")
    return record


async def get_batch(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    record = await _owned(state, request.path_params["batch_id"], principal.tenant)
    return JSONResponse(batch_object(record))


async def cancel_batch(request: Request) -> Response:
    """validating / in_progress -> cancelling (the supervisor stops the lines, then
    cancelled); a batch already cancelling or cancelled is returned as it is; 409 otherwise."""
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    record = await cancel_owned(state, request.path_params["batch_id"], principal.tenant)
    return JSONResponse(batch_object(record))


async def cancel_owned(state: GatewayState, batch_id: str, tenant: str) -> BatchRecord:
    """Cancel the tenant's batch (also the operator console's cancel); the batch after it."""
    record = await _owned(state, batch_id, tenant)
    outcome = await runtime(state).batches.transition(
        batch_id,
        [BatchStatus.VALIDATING.value, BatchStatus.IN_PROGRESS.value],
        BatchStatus.CANCELLING.value,
        {"cancelling_at": int(time.time()), "stop": StopReason.CANCELLED.value},
    )
    if outcome != "ok" and outcome not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
        raise APIError(
            409,
            f"Cannot cancel a batch with status '{record.status.value}'.",
            "invalid_request_error",
            "batch_not_cancellable",
        )
    return await _owned(state, batch_id, tenant)


async def list_batches(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    limit, after = page_params(request, MAX_BATCHES_PAGE, 20)
    records = await runtime(state).batches.list_page(principal.tenant, limit + 1, after)
    return JSONResponse(list_body([batch_object(r) for r in records[:limit]], len(records) > limit))


def batch_routes() -> list[Route]:
    """Every Files and Batch API route, for the app factory."""
    return [
        Route("/v1/files", routes_files.create_file, methods=["POST"]),
        Route("/v1/files", routes_files.list_files, methods=["GET"]),
        Route("/v1/files/{file_id}", routes_files.get_file, methods=["GET"]),
        Route("/v1/files/{file_id}", routes_files.delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", routes_files.file_content, methods=["GET"]),
        Route("/v1/batches", create_batch, methods=["POST"]),
        Route("/v1/batches", list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", get_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
    ]
