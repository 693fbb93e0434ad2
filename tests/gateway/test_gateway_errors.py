"""OpenAI-shaped errors through a tiny Starlette app, and the guarded JSON body reader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

import gateway.http.errors as errors_module
from gateway.http.body import json_depth_exceeds, read_json_body
from gateway.http.errors import (
    EXCEPTION_HANDLERS,
    APIError,
    install_error_handlers,
    retry_after_header_s,
)

MAX_BODY_BYTES = 8192
SECRET = "password=hunter2"


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse(await read_json_body(request, MAX_BODY_BYTES))


async def _queue_full(request: Request) -> JSONResponse:
    raise APIError.queue_full("The bulk queue is full.", retry_after_s=2.5)


async def _boom(request: Request) -> JSONResponse:
    raise RuntimeError(f"internal detail {SECRET}")


ROUTES = [
    Route("/echo", _echo, methods=["POST"]),
    Route("/full", _queue_full),
    Route("/boom", _boom),
]


def _client() -> TestClient:
    app = Starlette(routes=ROUTES, exception_handlers=dict(EXCEPTION_HANDLERS))
    # The 500 handler answers, then Starlette re-raises for the server to log; keep the answer.
    return TestClient(app, raise_server_exceptions=False)


def _error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "code", "param"}
    error: dict[str, Any] = body["error"]
    return error


def test_all_names_exist() -> None:
    for name in errors_module.__all__:
        assert hasattr(errors_module, name), name


def test_api_error_renders_openai_shape_with_retry_after() -> None:
    response = _client().get("/full")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert _error(response) == {
        "message": "The bulk queue is full.",
        "type": "rate_limit_error",
        "code": "queue_full",
        "param": None,
    }


@pytest.mark.parametrize(
    ("error", "status", "error_type", "code"),
    [
        (APIError.invalid_request("bad", param="n"), 400, "invalid_request_error", "invalid_value"),
        (APIError.authentication("who?", "missing_api_key"), 401, "authentication_error", None),
        (APIError.permission("no"), 403, "permission_error", "permission_denied"),
        (APIError.not_found("gone"), 404, "not_found_error", "not_found"),
        (APIError.request_too_large("big"), 413, "invalid_request_error", "request_too_large"),
        (APIError.rate_limit("slow down", 0.2), 429, "rate_limit_error", "rate_limit_exceeded"),
        (APIError.deadline_unmeetable("late", 30, "deadline_s"), 429, "rate_limit_error", None),
        (APIError.service_unavailable("draining"), 503, "service_unavailable", None),
        (APIError.internal(), 500, "server_error", "internal_error"),
    ],
)
def test_helpers(error: APIError, status: int, error_type: str, code: str | None) -> None:
    assert error.status == status
    assert error.type == error_type
    if code is not None:
        assert error.code == code
    if status == 429:
        assert error.headers["Retry-After"].isdigit()
    if status == 401:
        assert error.headers["WWW-Authenticate"] == "Bearer"


def test_deadline_unmeetable_names_param_and_code() -> None:
    error = APIError.deadline_unmeetable("late", 30.2, param="deadline_s")
    assert (error.code, error.param, error.headers["Retry-After"]) == (
        "deadline_unmeetable",
        "deadline_s",
        "31",
    )


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after_header_s(0.0) == "1"
    assert retry_after_header_s(0.2) == "1"
    assert retry_after_header_s(2.0) == "2"
    assert retry_after_header_s(2.01) == "3"
    assert retry_after_header_s(float("nan")) == "1"
    assert retry_after_header_s(float("inf")) == "86400"


def test_api_error_rejects_non_error_status() -> None:
    with pytest.raises(ValueError):
        APIError(200, "fine", "server_error")


def test_unknown_route_is_404_in_openai_shape() -> None:
    response = _client().get("/v1/nope")
    assert response.status_code == 404
    error = _error(response)
    assert error["type"] == "not_found_error"
    assert "/v1/nope" in error["message"]


def test_wrong_method_is_405_with_allow_header() -> None:
    response = _client().get("/echo")
    assert response.status_code == 405
    assert "POST" in response.headers["allow"]
    assert _error(response)["type"] == "invalid_request_error"


async def _ok(request: Request) -> JSONResponse:
    return JSONResponse({})


def test_405_allow_lists_the_methods_of_every_route_at_the_path() -> None:
    # One route per method, as the gateway registers them: Starlette alone names only the
    # first route's methods.
    routes = [
        Route("/things/{thing_id}", _ok, methods=["GET"]),
        Route("/things/{thing_id}", _ok, methods=["DELETE"]),
        Route("/other", _ok, methods=["PUT"]),
    ]
    app = Starlette(routes=routes, exception_handlers=dict(EXCEPTION_HANDLERS))
    response = TestClient(app).request("OPTIONS", "/things/7")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD, DELETE"
    assert _error(response)["code"] == "method_not_allowed"


def test_unhandled_exception_is_generic_500() -> None:
    response = _client().get("/boom")
    assert response.status_code == 500
    error = _error(response)
    assert error["type"] == "server_error"
    assert SECRET not in response.text
    assert "RuntimeError" not in response.text


def test_install_error_handlers_on_a_built_app() -> None:
    app = Starlette(routes=ROUTES)
    install_error_handlers(app)
    client = TestClient(app, raise_server_exceptions=False)
    assert _error(client.get("/full"))["code"] == "queue_full"
    assert _error(client.get("/missing"))["type"] == "not_found_error"
    assert client.get("/boom").status_code == 500


# ---- read_json_body -------------------------------------------------------------------------


def test_valid_object_is_returned() -> None:
    response = _client().post("/echo", json={"model": "m", "n": 1, "text": "[[[ not nesting"})
    assert response.status_code == 200
    assert response.json() == {"model": "m", "n": 1, "text": "[[[ not nesting"}


def test_body_over_limit_by_content_length_is_413() -> None:
    response = _client().post("/echo", content=b"{" + b" " * MAX_BODY_BYTES + b"}")
    assert response.status_code == 413
    assert _error(response)["code"] == "request_too_large"


def test_chunked_body_over_limit_is_413() -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"a": "'
        for _ in range(200):
            yield b"x" * 64
        yield b'"}'

    response = _client().post("/echo", content=chunks())
    assert "content-length" not in response.request.headers  # really streamed
    assert response.status_code == 413


def test_chunked_body_under_limit_is_read() -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"a": '
        yield b"1}"

    response = _client().post("/echo", content=chunks())
    assert response.status_code == 200
    assert response.json() == {"a": 1}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"a": "\xff\xfe"}', "UTF-8"),
        (b'{"a": 1', "could not parse"),
        (b"{'a': 1}", "could not parse"),
        (b'{"a": NaN}', "could not parse"),
        (b'{"a": -Infinity}', "could not parse"),
        (b'{"a": ' + b"9" * 5000 + b"}", "could not parse"),
        (b"", "empty"),
        (b"[1, 2]", "must be a JSON object"),
        (b'"text"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
    ],
)
def test_bad_bodies_are_400(body: bytes, fragment: str) -> None:
    response = _client().post("/echo", content=body)
    assert response.status_code == 400
    error = _error(response)
    assert error["type"] == "invalid_request_error"
    assert fragment in error["message"]


def test_deep_nesting_is_400() -> None:
    deep = '{"a": ' + "[" * 80 + "]" * 80 + "}"
    response = _client().post("/echo", content=deep.encode())
    assert response.status_code == 400
    assert "deeper than 64" in _error(response)["message"]


def test_invalid_content_length_is_400() -> None:
    response = _client().post("/echo", content=b"{}", headers={"content-length": "abc"})
    assert response.status_code == 400


@pytest.mark.parametrize(
    ("text", "max_depth", "exceeds"),
    [
        ("{}", 1, False),
        ('{"a": [1, {"b": []}]}', 4, False),  # object > array > object > array
        ('{"a": [1, {"b": []}]}', 3, True),
        ("[" * 64 + "]" * 64, 64, False),
        ("[" * 65 + "]" * 65, 64, True),
        ('{"a": "' + "[" * 500 + '"}', 2, False),  # brackets in strings do not nest
        ('{"a": "\\"[[[[[", "b": []}', 2, False),  # nor after an escaped quote
        ("[[[", 3, False),  # unbalanced: left for the parser to reject
        ("[[[", 2, True),  # ...unless it is already too deep
        ("[" + "[],{}," * 1000 + "[]]", 2, False),
    ],
)
def test_json_depth_exceeds(text: str, max_depth: int, exceeds: bool) -> None:
    assert json_depth_exceeds(text, max_depth) is exceeds


def test_depth_check_handles_a_megabyte_of_brackets() -> None:
    assert json_depth_exceeds("[" * 500_000 + "]" * 500_000, 64)
    # Many trees exactly at the limit: the worst case for a pass-per-level algorithm.
    assert not json_depth_exceeds(("[" * 64 + "]" * 64) * 8_000, 64)


def test_depth_check_is_linear_on_unterminated_escaped_quotes() -> None:
    # A regex that needs the closing quote rescans the tail from every quote: O(n^2), minutes.
    assert not json_depth_exceeds('"' + '\\"' * 200_000, 64)
    assert not json_depth_exceeds('{"a": "x\\', 64)
