"""The bulk jobs API: POST /v1/jobs (202 + Location), GET /v1/jobs/{id}, DELETE /v1/jobs/{id},
GET /v1/jobs (the caller's jobs, newest first, cursor paging).

A job is accepted only once Redis holds it (the admit script answered, with AOF on); its
result is written by whichever replica ran it. Another tenant's job is a 404.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.admission.intake import (
    admit,
    authenticate,
    build_payload_off_loop,
    request_class,
    require_model,
    require_ready,
)
from gateway.http.auth import Principal
from gateway.http.body import read_json_body
from gateway.http.errors import APIError
from gateway.http.schemas import chat_completion_body, job_deadline_s, parse_job_request
from gateway.http.state import GatewayState
from gateway.queue import JobStatus
from gateway.queue.job import JobStatusView
from gateway.runtime.redis_health import require_redis
from policies.request_class import RequestClass

MAX_PAGE = 100


async def create_job(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    # Redis first: its 503 carries Retry-After and a precise code.
    require_redis(state)
    require_ready(state)
    principal = authenticate(request, state)
    async with state.intake_lane.bulk():
        return await _create_job(request, state, principal)


async def _create_job(request: Request, state: GatewayState, principal: Principal) -> Response:
    body = parse_job_request(await _body(request, state))
    require_model(state, body.model)
    cls = request_class(request, RequestClass.BULK, body.service_tier, principal)
    payload = await build_payload_off_loop(state, body, cls)
    metadata_json = orjson.dumps(body.metadata or {}).decode()
    admitted = await admit(
        state,
        principal,
        cls,
        payload,
        deadline_s=job_deadline_s(body),
        id_prefix="job-",
        custom_id=body.custom_id,
        metadata_json=metadata_json,
        batched=True,
    )
    state.metrics.requests.labels(cls.value, "jobs", "admitted").inc()
    # NOTE: answered from what was just admitted, not read back: the admit script wrote exactly
    # these fields, and a re-read cost every submission a round trip and a payload parse.
    view = JobStatusView(
        job_id=admitted.job_id,
        tenant=principal.tenant,
        request_class=cls,
        status=JobStatus.QUEUED,
        model=payload.model,
        created_s=payload.created_s,
        enqueue_ms=admitted.enqueue_ms,
        deadline_ms=admitted.deadline_ms or None,
        started_ms=None,
        finished_ms=None,
        attempts=0,
        custom_id=body.custom_id,
        metadata_json=metadata_json,
        result_json=None,
        error_json=None,
    )
    return _json(
        job_object(view),
        status_code=202,
        headers={"Location": f"/v1/jobs/{admitted.job_id}", **admitted.prediction_headers},
    )


async def get_job(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    view = await _store(state).get_job_status(request.path_params["job_id"], principal.tenant)
    if view is None:
        raise APIError.not_found("No job with that id.", param="job_id", code="job_not_found")
    return _json(job_object(view))


async def cancel_job(request: Request) -> Response:
    state: GatewayState = request.app.state.gw
    principal = authenticate(request, state)
    job_id = request.path_params["job_id"]
    store = _store(state)
    outcome = await store.cancel(job_id, principal.tenant, int(time.time() * 1000))
    view = await store.get_job_status(job_id, principal.tenant)
    if outcome == "not_found" or view is None:
        raise APIError.not_found("No job with that id.", param="job_id", code="job_not_found")
    body = job_object(view)
    body["cancel"] = outcome  # "cancelled", "cancelling" (running: stops shortly), or a status
    return _json(body)


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
    views = await _store(state).list_jobs(principal.tenant, limit + 1, after)
    page = views[:limit]
    return _json(
        {
            "object": "list",
            "data": [job_object(view) for view in page],
            "first_id": page[0].job_id if page else None,
            "last_id": page[-1].job_id if page else None,
            "has_more": len(views) > limit,
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


def _json(body: dict[str, Any], status_code: int = 200, headers: Any = None) -> Response:
    # orjson: job bodies (and their results) are the hot path of every poll.
    return Response(
        orjson.dumps(body), status_code=status_code, headers=headers, media_type="application/json"
    )


def job_object(view: JobStatusView) -> dict[str, Any]:
    """A job as the API shows it: status, timings, and the chat.completion result when done."""
    result = orjson.loads(view.result_json) if view.result_json else None
    response = None
    if result is not None:
        response = chat_completion_body(
            view.job_id,
            view.created_s,
            view.model,
            result["text"],
            result["finish_reason"],
            result["usage"],
        )
    return {
        "id": view.job_id,
        "object": "job",
        "status": view.status.value,
        "class": view.request_class.value,
        "model": view.model,
        "custom_id": view.custom_id,
        "metadata": orjson.loads(view.metadata_json or "{}"),
        "created_at": _seconds(view.enqueue_ms),
        "deadline_at": _seconds(view.deadline_ms),
        "started_at": _seconds(view.started_ms),
        "finished_at": _seconds(view.finished_ms),
        "attempts": view.attempts,
        "response": response,
        "timings": result.get("timings") if result else None,
        "error": orjson.loads(view.error_json) if view.error_json else None,
    }
