"""The operator console's routes: the page and its static files under /console, and the small
JSON API the page reads under /console/api.

Access: every API route takes the same ``Authorization: Bearer`` key as the API. A tenant's
key sees its own jobs and batches; a key marked ``admin`` in the key file sees every
configured tenant's and the live view; open dev mode (no keys) sees everything, and the page
shows the warning the server logs. The console's reads do not count against a key's rate
limit (the page polls once a second); they are a page of ids and hashes each.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from gateway.batch.records import BatchRecord, batch_object
from gateway.console.listing import merged_page, parse_cursor
from gateway.console.live import LATENCY_WINDOW_S, ConsoleLive
from gateway.http import routes_batches
from gateway.http.auth import OPEN_MODE_WARNING, Principal
from gateway.http.errors import APIError
from gateway.http.routes_files import runtime
from gateway.http.routes_jobs import job_object
from gateway.http.state import GatewayState
from gateway.queue import QueueStore
from gateway.runtime.redis_health import require_redis

__all__ = ["console_routes"]

MAX_PAGE: Final = 100
DEFAULT_PAGE: Final = 20


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gw
    return state


def _principal(request: Request) -> tuple[GatewayState, Principal]:
    state = _state(request)
    return state, state.auth.authenticate(request.headers.get("authorization"))


def sees_all(state: GatewayState, principal: Principal) -> bool:
    return principal.admin or state.auth.is_open


def _tenants(request: Request, state: GatewayState, principal: Principal) -> tuple[str, ...]:
    if not sees_all(state, principal):
        return (principal.tenant,)
    wanted = request.query_params.get("tenant")
    return (wanted,) if wanted else state.auth.tenants


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", str(DEFAULT_PAGE))
    limit = int(raw) if raw.isdigit() else 0
    if not 1 <= limit <= MAX_PAGE:
        raise APIError.invalid_request(f"limit must be an integer in 1..{MAX_PAGE}", param="limit")
    return limit


def _store(state: GatewayState) -> QueueStore:
    require_redis(state)
    if state.store is None or state.redis is None:
        raise APIError.service_unavailable("the queue store is not connected yet")
    return state.store


# ---- the page ---------------------------------------------------------------------------------


async def index(request: Request) -> Response:
    # importlib.resources: the page ships inside the package (a wheel install has it too).
    page = resources.files("gateway.console").joinpath("static", "index.html").read_bytes()
    return HTMLResponse(page, headers={"cache-control": "no-cache"})


async def mode(request: Request) -> Response:
    """Whether keys are needed at all (no key asked): the page then asks for one, or not."""
    is_open = _state(request).auth.is_open
    return JSONResponse({"open_mode": is_open, "warning": OPEN_MODE_WARNING if is_open else None})


# ---- who is looking -----------------------------------------------------------------------------


async def session(request: Request) -> Response:
    state, principal = _principal(request)
    everything = sees_all(state, principal)
    return JSONResponse(
        {
            "object": "console.session",
            "tenant": principal.tenant,
            "admin": principal.admin,
            "open_mode": state.auth.is_open,
            "warning": OPEN_MODE_WARNING if state.auth.is_open else None,
            "sees_all_tenants": everything,
            "live_view": everything,
            "tenants": list(state.auth.tenants) if everything else [principal.tenant],
            "classes": sorted(c.value for c in principal.allowed_classes),
            "model": state.model_name,
            "replica_id": state.settings.replica_id,
            "latency_window_s": LATENCY_WINDOW_S,
        }
    )


async def live(request: Request) -> Response:
    state, principal = _principal(request)
    if not sees_all(state, principal):
        raise APIError(
            403,
            'The live view needs an admin key (mark the key "admin": true in the key file).',
            "permission_error",
            "admin_required",
        )
    console: ConsoleLive = request.app.state.console
    return JSONResponse(await console.body())


async def envelope(request: Request) -> Response:
    state, _ = _principal(request)
    return JSONResponse(state.envelope.to_dict())


# ---- jobs ----------------------------------------------------------------------------------------


async def list_jobs(request: Request) -> Response:
    state, principal = _principal(request)
    store = _store(state)
    assert state.redis is not None
    listings = [(store.keys.tenant_jobs(t), t) for t in _tenants(request, state, principal)]
    items, has_more = await merged_page(
        state.redis, listings, _limit(request), parse_cursor(request.query_params.get("after"))
    )
    views = await store.job_statuses([i.item_id for i in items])
    data = []
    for view in views:
        if view is None:
            continue  # its hash is gone (retention) while its listing entry remains
        body = job_object(view)
        body.pop("response", None)  # the list shows status, not the generated text
        body["tenant"] = view.tenant
        data.append(body)
    return JSONResponse(_page(data, items, has_more))


async def cancel_job(request: Request) -> Response:
    state, principal = _principal(request)
    store = _store(state)
    assert state.redis is not None
    job_id = request.path_params["job_id"]
    tenant = principal.tenant
    if sees_all(state, principal):
        owner = await state.redis.hget(store.keys.job(job_id), "tenant")
        tenant = str(owner) if owner else tenant
    outcome = await store.cancel(job_id, tenant, int(time.time() * 1000))
    view = await store.get_job_status(job_id, tenant)
    if outcome == "not_found" or view is None:
        raise APIError.not_found("No job with that id.", param="job_id", code="job_not_found")
    body = job_object(view)
    body.pop("response", None)
    body["tenant"] = view.tenant
    body["cancel"] = outcome
    return JSONResponse(body)


# ---- batches -------------------------------------------------------------------------------------


async def list_batches(request: Request) -> Response:
    state, principal = _principal(request)
    require_redis(state)
    batches = runtime(state).batches
    assert state.redis is not None
    listings = [(batches.keys.tenant_batches(t), t) for t in _tenants(request, state, principal)]
    items, has_more = await merged_page(
        state.redis, listings, _limit(request), parse_cursor(request.query_params.get("after"))
    )
    records = await asyncio.gather(*(batches.get(i.item_id, None) for i in items))
    data = [_batch_row(r) for r in records if r is not None]
    return JSONResponse(_page(data, items, has_more))


def _batch_row(record: BatchRecord) -> dict[str, Any]:
    body = batch_object(record)
    body["tenant"] = record.tenant
    return body


async def _visible_batch(request: Request) -> tuple[GatewayState, BatchRecord]:
    state, principal = _principal(request)
    require_redis(state)
    batch_id = request.path_params["batch_id"]
    tenant = None if sees_all(state, principal) else principal.tenant
    record = await runtime(state).batches.get(batch_id, tenant)
    if record is None:
        raise APIError.not_found(f"No such Batch object: {batch_id[:64]}", param="batch_id")
    return state, record


async def cancel_batch(request: Request) -> Response:
    state, record = await _visible_batch(request)
    cancelled = await routes_batches.cancel_owned(state, record.batch_id, record.tenant)
    return JSONResponse(_batch_row(cancelled))


async def batch_file(request: Request) -> Response:
    """A batch's output or error file, as an attachment."""
    state, record = await _visible_batch(request)
    which = request.path_params["which"]
    if which not in ("output", "error"):
        raise APIError.not_found("A batch has an output and an error file.", param="which")
    file_id = record.output_file_id if which == "output" else record.error_file_id
    files = runtime(state).files
    file = await files.get(file_id, record.tenant) if file_id else None
    if file is None:
        raise APIError.not_found(f"This batch has no {which} file (yet).", param="which")
    try:
        chunks = files.chunks(file)
    except FileNotFoundError:
        raise APIError.not_found("The file's content is gone.", param="which") from None
    disposition = f'attachment; filename="{record.batch_id}-{which}.jsonl"'
    return StreamingResponse(
        chunks, media_type="application/jsonl", headers={"content-disposition": disposition}
    )


def _page(data: list[dict[str, Any]], items: list[Any], has_more: bool) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "next_after": items[-1].cursor.encode() if items and has_more else None,
        "has_more": has_more,
    }


def console_routes() -> list[BaseRoute]:
    """The console, mounted at /console for the app factory (its static files ship in the
    package; ``/console`` itself redirects to ``/console/``, by Starlette's slash rule). A
    mount of its own: the console's API is not part of the OpenAI-shaped API that
    /openapi.json documents."""
    routes: list[BaseRoute] = [
        Route("/", index, methods=["GET"]),
        Mount(
            "/static",
            app=StaticFiles(packages=[("gateway.console", "static")]),
            name="console-static",
        ),
        Route("/api/mode", mode, methods=["GET"]),
        Route("/api/session", session, methods=["GET"]),
        Route("/api/live", live, methods=["GET"]),
        Route("/api/envelope", envelope, methods=["GET"]),
        Route("/api/jobs", list_jobs, methods=["GET"]),
        Route("/api/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
        Route("/api/batches", list_batches, methods=["GET"]),
        Route("/api/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
        Route("/api/batches/{batch_id}/files/{which:str}", batch_file, methods=["GET"]),
    ]
    return [Mount("/console", routes=routes)]
