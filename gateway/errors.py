"""OpenAI-shaped HTTP errors, the exception handlers that render them, and a guarded JSON reader.

Every error leaves the gateway as ``{"error": {"message", "type", "code", "param"}}``, the shape
OpenAI's SDKs parse, so a client sees the same fields whether a route refused the request, the
router found no route, or something crashed.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from http import HTTPStatus
from itertools import accumulate
from typing import Any, Final

import orjson
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route

from gateway.redis_health import mark_unreachable

__all__ = [
    "DEFAULT_MAX_JSON_DEPTH",
    "EXCEPTION_HANDLERS",
    "APIError",
    "allowed_methods",
    "error_body",
    "error_response",
    "install_error_handlers",
    "json_depth_exceeds",
    "read_json_body",
    "retry_after_header_s",
]

INVALID_REQUEST: Final = "invalid_request_error"
AUTHENTICATION: Final = "authentication_error"
PERMISSION: Final = "permission_error"
NOT_FOUND: Final = "not_found_error"
RATE_LIMIT: Final = "rate_limit_error"
SERVER_ERROR: Final = "server_error"
SERVICE_UNAVAILABLE: Final = "service_unavailable"

# Deep enough for any real chat body (messages -> content parts -> part is depth 4), shallow
# enough that no parser or validator downstream recurses far.
DEFAULT_MAX_JSON_DEPTH: Final = 64

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


# ---- reading a JSON body safely -------------------------------------------------------------

# A JSON string with its escapes, as an unrolled loop that never backtracks. An unterminated
# string runs to the end of the text: requiring the closing quote would make every later quote
# rescan the rest of the text (quadratic on '"' + '\\"' * n), and that text is malformed anyway.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# Opening brackets -> byte 0x01, closing -> 0xFF: read as signed bytes, +1 and -1.
_BRACKET_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def json_depth_exceeds(text: str, max_depth: int) -> bool:
    """Whether the JSON text nests objects/arrays deeper than ``max_depth``, without parsing it.

    Strings are blanked first (brackets inside them do not nest); the running sum of +1 per
    opening and -1 per closing bracket is then the depth at each point. Every step runs in C
    (regex, translate, accumulate over a memoryview), so a megabyte of brackets costs tens of
    milliseconds, not the recursion it would cost a parser.
    """
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub('""', text))
    steps = memoryview(brackets.encode("ascii").translate(_BRACKET_STEPS)).cast("b")
    return max(accumulate(steps), default=0) > max_depth


def _too_large(max_body_bytes: int) -> APIError:
    return APIError.request_too_large(
        f"Request body is too large: the limit is {max_body_bytes} bytes."
    )


def _check_content_length(request: Request, max_body_bytes: int) -> None:
    declared = request.headers.get("content-length")
    if declared is None:
        return
    if not declared.strip().isdigit():
        raise APIError.invalid_request("Invalid Content-Length header.", code="invalid_header")
    if int(declared) > max_body_bytes:
        raise _too_large(max_body_bytes)


def _too_slow(read_timeout_s: float) -> APIError:
    return APIError(
        408,
        f"The request body did not arrive within {read_timeout_s:g} s.",
        INVALID_REQUEST,
        "request_timeout",
    )


async def _read_bounded(
    request: Request, max_body_bytes: int, read_timeout_s: float | None = None
) -> bytes:
    """The whole body, at most `max_body_bytes`, within `read_timeout_s` in all.

    NOTE: the timeout bounds the whole body, not the gap between chunks: a slow-loris client
    that trickles a byte every few seconds would pass any per-chunk timeout while holding a
    connection (and a handler) for as long as it likes.
    """
    if read_timeout_s is None:
        return await _read_all(request, max_body_bytes)
    try:
        async with asyncio.timeout(read_timeout_s):
            return await _read_all(request, max_body_bytes)
    except TimeoutError:
        raise _too_slow(read_timeout_s) from None


async def _read_all(request: Request, max_body_bytes: int) -> bytes:
    chunks: list[bytes] = []
    received_bytes = 0
    # aclosing: stopping early must still close the generator (an unclosed one warns).
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            received_bytes += len(chunk)
            # A chunked body has no Content-Length, so the bytes themselves are counted.
            if received_bytes > max_body_bytes:
                raise _too_large(max_body_bytes)
            chunks.append(chunk)
    return b"".join(chunks)


def _parse_json(raw: bytes, max_depth: int) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError.invalid_request(
            f"The request body is not valid UTF-8 (invalid byte at offset {exc.start}).",
            code="invalid_json",
        ) from None
    if json_depth_exceeds(text, max_depth):
        raise APIError.invalid_request(
            f"The JSON body nests deeper than {max_depth} levels.", code="invalid_json"
        )
    try:
        # orjson (~10x json's speed on a chat body) refuses NaN/Infinity, numbers past a
        # double's range and lone surrogates itself, all of which json.loads let through.
        return orjson.loads(raw)
    except json.JSONDecodeError as exc:  # orjson.JSONDecodeError is a subclass
        message = (
            "We could not parse the JSON body of your request: "
            f"{exc.msg} (line {exc.lineno}, column {exc.colno})."
        )
        raise APIError.invalid_request(message, code="invalid_json") from None
    except (ValueError, RecursionError):
        # NaN/Infinity, integers past Python's digit limit, or nesting the depth check missed;
        # the exception's own text speaks of Python internals, so it is not passed on.
        message = (
            "We could not parse the JSON body of your request: it holds a value that is not "
            "valid JSON (NaN, Infinity) or a number too long to read."
        )
        raise APIError.invalid_request(message, code="invalid_json") from None


async def read_json_body(
    request: Request,
    max_body_bytes: int,
    max_depth: int = DEFAULT_MAX_JSON_DEPTH,
    *,
    read_timeout_s: float | None = None,
) -> dict[str, Any]:
    """The request's JSON object, or an APIError: 413 over ``max_body_bytes``, 408 when the
    body takes longer than ``read_timeout_s`` to arrive (None: no limit), else 400.

    The size is checked against Content-Length before reading anything, then against the bytes
    actually received, so neither a lying header nor a chunked body gets past the limit.
    """
    _check_content_length(request, max_body_bytes)
    raw = await _read_bounded(request, max_body_bytes, read_timeout_s)
    if not raw.strip():
        raise APIError.invalid_request(
            "The request body is empty; expected a JSON object.", code="invalid_json"
        )
    data = _parse_json(raw, max_depth)
    if not isinstance(data, dict):
        raise APIError.invalid_request(
            "The request body must be a JSON object.", code="invalid_json"
        )
    return data
