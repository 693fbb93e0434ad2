"""The log lines `mixgate serve` writes: one JSON object per line, the same fields whether a line
comes from mixgate's own loggers (structlog's native path) or from a library's stdlib logger
(uvicorn's, through the formatter)."""

from __future__ import annotations

import logging

import orjson
import pytest
import structlog

from gateway.http.logging_setup import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers.clear()


def _lines(text: str) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def test_own_and_stdlib_lines_are_json_with_the_same_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("info")
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(request_id="req-1")
    structlog.get_logger("mixgate.access").info("request", status=200, duration_ms=1.5)
    # A library's own stdlib logger, as uvicorn's are (a fresh name: another test in the same
    # process may have run uvicorn, whose start-up sets its own loggers' levels).
    library = logging.getLogger("mixgate_test_library")
    library.setLevel(logging.NOTSET)
    library.info("library line")
    structlog.contextvars.clear_contextvars()
    own, stdlib = _lines(capsys.readouterr().err)
    assert own["event"] == "request" and own["status"] == 200 and own["duration_ms"] == 1.5
    assert own["logger"] == "mixgate.access" and own["request_id"] == "req-1"
    assert stdlib["event"] == "library line" and stdlib["logger"] == "mixgate_test_library"
    for line in (own, stdlib):
        assert line["level"] == "info"
        assert str(line["timestamp"]).endswith("Z")


def test_lines_below_the_level_are_dropped_and_exceptions_are_rendered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    configure_logging("warning")
    log = structlog.get_logger("mixgate.test")
    log.info("hidden")
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        log.exception("failed", job_id="job-1")
    # A value JSON cannot hold is logged as its str(), not an error; non-str keys are kept.
    log.warning("odd", value=object(), counts={1: 2})
    failed, odd = _lines(capsys.readouterr().err)
    assert failed["event"] == "failed" and failed["level"] == "error"
    assert "ZeroDivisionError: boom" in str(failed["exception"])
    assert str(odd["value"]).startswith("<object object")
    assert odd["counts"] == {"1": 2}
