"""structlog JSON logs; uvicorn's loggers through the same renderer; a request id per request."""

from __future__ import annotations

import logging
import secrets
import sys
import time
from typing import Any

import orjson
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"


def configure_logging(level: str = "info", json: bool = True) -> None:
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_orjson_line)
        if json
        else structlog.dev.ConsoleRenderer()
    )
    level_number = logging.getLevelNamesMapping()[level.upper()]
    # NOTE: mixgate's own lines take structlog's native path (a filtering bound logger that
    # writes the rendered line itself), not stdlib logging, and orjson renders it: through
    # logging's LogRecord, handler lock and ProcessorFormatter with the json module one access
    # line cost ~52 us, a fifth of a job status poll's whole server time; this way ~12 us.
    # The line is the same JSON (the logger's name included). Other libraries' stdlib loggers
    # (uvicorn's) still go through the formatter.
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        logger_factory=_NamedLineLoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level_number),
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # uvicorn's loggers propagate to the root handler instead of their own formatters.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


def _orjson_line(event: dict[str, Any], **_: Any) -> str:
    # default=str: a value orjson cannot encode is logged as its str(), never an error.
    return orjson.dumps(event, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class _NamedLineLogger(structlog.WriteLogger):
    """structlog's line writer to stderr, with the name `get_logger` was given, so that
    `add_logger_name` fills the `logger` field as stdlib loggers do."""

    def __init__(self, name: str) -> None:
        # stderr as it is now (the stdlib handler's stream too), looked up per logger, not
        # at import, so a redirected stderr is honoured.
        super().__init__(sys.stderr)
        self.name = name


class _NamedLineLoggerFactory:
    def __call__(self, *args: Any) -> _NamedLineLogger:
        return _NamedLineLogger(str(args[0]) if args else "")


class RequestIdMiddleware:
    """Bind a request id (the client's X-Request-Id or a fresh one) for every log line of a
    request, echo it in the response, and log one access line with the status and duration.

    A pure ASGI middleware, so it works for streaming responses too.
    """

    def __init__(self, app: ASGIApp):
        self.app = app
        self.log = structlog.get_logger("mixgate.access")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or secrets.token_hex(8)
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started_s = time.perf_counter()
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((REQUEST_ID_HEADER, request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.log.info(
                "request",
                method=scope.get("method"),
                path=scope.get("path"),
                status=status,
                duration_ms=round((time.perf_counter() - started_s) * 1000, 2),
            )


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == REQUEST_ID_HEADER:
            text: str = value.decode("latin-1")
            # Only a short token-like id is echoed back (no header injection through it).
            if 0 < len(text) <= 64 and all(c.isalnum() or c in "-_." for c in text):
                return text
    return None
