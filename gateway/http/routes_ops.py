"""Operational routes: /health, /healthz, /readyz, /metrics, /v1/models, /v1/envelope,
/openapi.json."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.http.openapi import build_openapi
from gateway.http.state import GatewayState


def _state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gw
    return state


async def healthz(request: Request) -> Response:
    """Liveness: the process answers. Readiness is /readyz."""
    return JSONResponse({"status": "ok"})


async def health(request: Request) -> Response:
    """Liveness as vLLM answers it (200, empty body): the path that vLLM-era clients (guidellm,
    vllm bench serve's readiness probe) check before they start."""
    return Response(status_code=200)


async def readyz(request: Request) -> Response:
    reasons = _state(request).not_ready_reasons()
    if reasons:
        return JSONResponse({"ready": False, "reasons": reasons}, status_code=503)
    return JSONResponse({"ready": True})


async def metrics(request: Request) -> Response:
    body = _state(request).metrics.render()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


async def models(request: Request) -> Response:
    state = _state(request)
    state.auth.authenticate(request.headers.get("authorization"))
    model = {
        "id": state.model_name,
        "object": "model",
        "created": int(state.started_s),
        "owned_by": "mixgate",
    }
    return JSONResponse({"object": "list", "data": [model]})


async def envelope(request: Request) -> Response:
    """The operating envelope in force, with where it came from."""
    return JSONResponse(_state(request).envelope.to_dict())


async def openapi(request: Request) -> Response:
    return JSONResponse(build_openapi())
