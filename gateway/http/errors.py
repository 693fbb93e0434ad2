"""OpenAI-shaped HTTP errors and the exception handlers that render them (bodies: body.py).

Every error leaves the gateway as ``{"error": {"message", "type", "code", "param"}}``, the shape
OpenAI's SDKs parse, so a client sees the same fields whether a route refused the request, the
router found no route, or something crashed.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any, Final

from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from gateway.runtime.redis_health import mark_unreachable

__all__ = [
    "EXCEPTION_HANDLERS",
    "APIError",
    "allowed_methods",
    "error_body",
    "error_response",
    "install_error_handlers",
    "retry_after_header_s",
]

INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
PERMISSION: Final = "permission_error"
NOT_FOUND: Final = "not_found_error"
RATE_LIMIT: Final = "rate_limit_error"
SERVER_ERROR: Final = "server_error"
SERVICE_UNAVAILABLE: Final = "service_unavailable"

# The same words OpenAI uses, so a client's "is this our bug?" heuristics keep working.
_INTERNAL_ERROR_MESSAGE: Final = (
    "The server had an error while processing your request. Sorry about that!"
)
_MAX_RETRY_AFTER_S: Final = 86_400.0
# A reflected path is client input: keep it short in the message.
_MAX_REFLECTED_PATH_CHARS: Final = 200


def retry_after_header_s(retry_after_s: float) -> str:
    """``Retry-After`` takes whole seconds; round up and never say 0 (clients would spin)."""
    if math.isnan(retry_after_s):
        return "1"
    # An infinite or absurd wait still needs a number; a day is "come back much later".
    return str(max(1, math.ceil(min(retry_after_s, _MAX_RETRY_AFTER_S))))


class APIError(Exception):
    """An error a handler raises to answer with an OpenAI-shaped body.

    ``type`` is OpenAI's error class (``invalid_request_error``, ...); ``code`` is the specific
    machine-readable reason; ``param`` names the request input at fault (a body field path such
    as ``messages.0.content``, or a header name), or None.
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if not 400 <= status <= 599:
            raise ValueError(f"an APIError status must be 4xx or 5xx, got {status}")
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, type={self.type!r}, code={self.code!r})"

    # ---- the common ones ------------------------------------------------------------------

    @classmethod
    def invalid_request(
        cls, message: str, param: str | None = None, code: str | None = "invalid_value"
    ) -> APIError:
        return cls(400, message, INVALID_REQUEST, code, param)

    @classmethod
    def authentication(cls, message: str, code: str) -> APIError:
        # RFC 9110 requires a challenge on every 401.
        return cls(401, message, AUTHENTICATION, code, headers={"WWW-Authenticate": "Bearer"})

    @classmethod
    def permission(
        cls, message: str, code: str = "permission_denied", param: str | None = None
    ) -> APIError:
        return cls(403, message, PERMISSION, code, param)

    @classmethod
    def not_found(cls, message: str, code: str = "not_found", param: str | None = None) -> APIError:
        return cls(404, message, NOT_FOUND, code, param)

    @classmethod
    def request_too_large(
        cls, message: str, code: str = "request_too_large", param: str | None = None
    ) -> APIError:
        return cls(413, message, INVALID_REQUEST, code, param)

    @classmethod
    def rate_limit(
        cls, message: str, retry_after_s: float, code: str = "rate_limit_exceeded"
    ) -> APIError:
        headers = {"Retry-After": retry_after_header_s(retry_after_s)}
        return cls(429, message, RATE_LIMIT, code, headers=headers)

    @classmethod
    def queue_full(cls, message: str, retry_after_s: float) -> APIError:
        return cls.rate_limit(message, retry_after_s, code="queue_full")

    @classmethod
    def deadline_unmeetable(
        cls, message: str, retry_after_s: float, param: str | None = None
    ) -> APIError:
        error = cls.rate_limit(message, retry_after_s, code="deadline_unmeetable")
        error.param = param
        return error

    @classmethod
    def service_unavailable(
        cls, message: str, code: str = "service_unavailable", retry_after_s: float | None = None
    ) -> APIError:
        headers = (
            {} if retry_after_s is None else {"Retry-After": retry_after_header_s(retry_after_s)}
        )
        return cls(503, message, SERVICE_UNAVAILABLE, code, headers=headers)

    @classmethod
    def internal(cls) -> APIError:
        """The only 500 a client sees: generic on purpose, the details go to the log."""
        return cls(500, _INTERNAL_ERROR_MESSAGE, SERVER_ERROR, "internal_error")


def error_body(error: APIError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": error.type,
            "code": error.code,
            "param": error.param,
        }
    }


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error_body(error), status_code=error.status, headers=error.headers)


# ---- exception handlers ---------------------------------------------------------------------

_TYPE_BY_STATUS: Final[Mapping[int, str]] = {
    401: AUTHENTICATION,
    403: PERMISSION,
    404: NOT_FOUND,
    429: RATE_LIMIT,
    503: SERVICE_UNAVAILABLE,
}


def _http_exception_message(request: Request, exc: HTTPException) -> str:
    try:
        default_detail = HTTPStatus(exc.status_code).phrase
    except ValueError:
        default_detail = ""
    if exc.detail and exc.detail != default_detail:
        return exc.detail
    path = request.url.path[:_MAX_REFLECTED_PATH_CHARS]
    if exc.status_code == 404:
        return f"Invalid URL ({request.method} {path})"
    if exc.status_code == 405:
        return f"Method {request.method} is not allowed for {path}"
    return default_detail or f"HTTP {exc.status_code}"


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path, for a 405's ``Allow``.

    NOTE: Starlette's own 405 names only the methods of the first route whose path matched,
    and mixgate registers one route per method (GET and DELETE /v1/jobs/{job_id}), so its
    `Allow` left methods out; RFC 9110 wants them all.
    """
    app = request.scope.get("app")
    routes = getattr(getattr(app, "router", None), "routes", ())
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches({**request.scope, "method": next(iter(route.methods))})
            if match is Match.FULL:
                methods |= route.methods
    order = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
    return sorted(methods, key=lambda m: (order.index(m) if m in order else len(order), m))


async def _handle_api_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, APIError):  # pragma: no cover - Starlette dispatches by class
        raise exc
    return error_response(exc)


async def _handle_http_exception(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):  # pragma: no cover - Starlette dispatches by class
        raise exc
    status = exc.status_code
    if status < 400:
        # Redirect-style HTTPExceptions carry no error; keep Starlette's plain behaviour.
        return Response(status_code=status, headers=exc.headers)
    default_type = SERVER_ERROR if status >= 500 else INVALID_REQUEST
    headers = dict(exc.headers or {})
    if status == 405:
        methods = allowed_methods(request)
        if methods:
            headers["Allow"] = ", ".join(methods)
    error = APIError(
        status,
        _http_exception_message(request, exc),
        _TYPE_BY_STATUS.get(status, default_type),
        code="method_not_allowed" if status == 405 else None,
        headers=headers,
    )
    return error_response(error)


async def _handle_unexpected(request: Request, exc: Exception) -> Response:
    # NOTE: Starlette's ServerErrorMiddleware re-raises after sending this response, so the
    # server logs the traceback; the client only ever sees the generic message. An app built
    # with debug=True bypasses this handler and shows tracebacks: never in production.
    return error_response(APIError.internal())


async def _handle_redis_error(request: Request, exc: Exception) -> Response:
    # Redis down, or every pooled connection busy past the pool timeout: the request was not
    # accepted, so the client may retry (503, as docs/ARCHITECTURE.md's HTTP conventions say).
    state = getattr(request.app.state, "gw", None)
    if state is not None:
        # The next requests then fail fast instead of each finding out on its own.
        mark_unreachable(state, exc)
    return error_response(
        APIError.service_unavailable("the queue store is unavailable", "redis_unavailable", 1.0)
    )


_Handler = Callable[[Request, Exception], Awaitable[Response]]

# For `Starlette(exception_handlers=EXCEPTION_HANDLERS)`; `Exception` maps to the 500 handler.
EXCEPTION_HANDLERS: Final[Mapping[Any, _Handler]] = {
    APIError: _handle_api_error,
    HTTPException: _handle_http_exception,
    RedisError: _handle_redis_error,
    Exception: _handle_unexpected,
}


def install_error_handlers(app: Starlette) -> None:
    """Install the handlers on an app that is already built (before it serves a request)."""
    for exc_class, handler in EXCEPTION_HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
