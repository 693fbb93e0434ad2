"""The bulk jobs API: POST /v1/jobs (202 + Location), GET /v1/jobs/{id}, DELETE /v1/jobs/{id},
GET /v1/jobs (the caller's jobs, newest first, cursor paging).

A job is accepted only once Redis holds it (the admit script answered, with AOF on); its
result is written by whichever replica ran it. Another tenant's job is a 404.
"""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.auth import Principal
from gateway.errors import APIError, read_json_body
from gateway.intake import (
    admit,
    authenticate,
    build_payload,
    request_class,
    require_model,
    require_ready,
)
from gateway.job_payload import JobPayload
from gateway.queue import JobRecord
from gateway.redis_health import require_redis
from gateway.schemas import chat_completion_body, job_deadline_s, parse_job_request
from gateway.state import GatewayState
from policies.request_class import RequestClass

MAX_PAGE = 100


async def create_job(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    # Redis first: its 503 carries Retry-After and a precise code.
    require_redis(state)
    require_ready(state)
    principal = authenticate(request, state)
    async with state.job_intake:
        return await _create_job(request, state, principal)


async def _create_job(request: Request, state: GatewayState, principal: Principal) -> Response:
    body = parse_job_request(await _body(request, state))
    require_model(state, body.model)
    cls = request_class(request, RequestClass.BULK, body.service_tier, principal)
    payload = build_payload(state, body, cls)
    admitted = await admit(
        state,
        principal,
        cls,
        payload,
        deadline_s=job_deadline_s(body),
        id_prefix="job-",
        custom_id=body.custom_id,
        metadata_json=json.dumps(body.metadata or {}),
    )
    state.metrics.requests.labels(cls.value, "jobs", "admitted").inc()
    assert state.store is not None
    record = await state.store.get_job(admitted.job_id, principal.tenant)
    assert record is not None
    return JSONResponse(
        job_object(record),
        status_code=202,
        headers={"Location": f"/v1/jobs/{record.job_id}", **admitted.prediction_headers},
    )


async def get_job(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    record = await _store(state).get_job(request.path_params["job_id"], principal.tenant)
    if record is None:
        raise APIError.not_found("No job with that id.", param="job_id", code="job_not_found")
    return JSONResponse(job_object(record))


async def cancel_job(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    job_id = request.path_params["job_id"]
    store = _store(state)
    outcome = await store.cancel(job_id, principal.tenant, int(time.time() * 1000))
    record = await store.get_job(job_id, principal.tenant)
    if outcome == "not_found" or record is None:
        raise APIError.not_found("No job with that id.", param="job_id", code="job_not_found")
    body = job_object(record)
    body["cancel"] = outcome  # "cancelled", "cancelling" (running: stops shortly), or a status
    return JSONResponse(body)


async def list_jobs(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    try:
        limit = int(request.query_params.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_PAGE:
        raise APIError.invalid_request(f"limit must be an integer in 1..{MAX_PAGE}", param="limit")
    after = request.query_params.get("after")
    records = await _store(state).list_jobs(principal.tenant, limit + 1, after)
    page = records[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": [job_object(r) for r in page],
            "first_id": page[0].job_id if page else None,
            "last_id": page[-1].job_id if page else None,
            "has_more": len(records) > limit,
        }
    )


async def _body(request: Request, state: GatewayState) -> dict[str, Any]:
    settings = state.settings
    return await read_json_body(
        request, settings.max_body_bytes, read_timeout_s=settings.body_read_timeout_s
    )


def _store(state: GatewayState) -> Any:
    # Reads and cancels need Redis: while it is known to be down, 503 without waiting on it.
    require_redis(state)
    if state.store is None:
        raise APIError.service_unavailable("the queue store is not connected yet")
    return state.store


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0


def job_object(record: JobRecord) -> dict[str, Any]:
    """A job as the API shows it: status, timings, and the chat.completion result when done."""
    payload = JobPayload.from_json(record.request_json)
    result = json.loads(record.result_json) if record.result_json else None
    response = None
    if result is not None:
        response = chat_completion_body(
            record.job_id,
            payload.created_s,
            payload.model,
            result["text"],
            result["finish_reason"],
            result["usage"],
        )
    return {
        "id": record.job_id,
        "object": "job",
        "status": record.status.value,
        "class": record.request_class.value,
        "model": payload.model,
        "custom_id": record.custom_id,
        "metadata": json.loads(record.metadata_json or "{}"),
        "created_at": _seconds(record.enqueue_ms),
        "deadline_at": _seconds(record.deadline_ms),
        "started_at": _seconds(record.started_ms),
        "finished_at": _seconds(record.finished_ms),
        "attempts": record.attempts,
        "response": response,
        "timings": result.get("timings") if result else None,
        "error": json.loads(record.error_json) if record.error_json else None,
    }
