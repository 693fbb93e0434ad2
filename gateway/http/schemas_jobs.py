"""The bulk job request body: a chat completion body plus what a queued job needs."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from gateway.http.schemas_chat import ChatCompletionRequest, ChatStreamOptions
from gateway.http.schemas_sampling import CHAT_CROSS_FIELD_RULES, ParamError, not_both

__all__ = [
    "COMPLETION_WINDOW_PATTERN",
    "CUSTOM_ID_PATTERN",
    "CompletionWindow",
    "MAX_JOB_WINDOW_S",
    "JobCreateRequest",
    "job_deadline_s",
    "parse_completion_window_s",
]

# NOTE: custom_id is echoed in headers, logs and Redis fields; a closed alphabet rules out
# header injection ("\r\n") and key-separator games once, here, instead of at every use.
CUSTOM_ID_PATTERN: Final = r"^[A-Za-z0-9._:-]{1,64}$"
# NOTE: bounded so a deadline is always a sane integer number of milliseconds; a job that may
# take longer than a week is better resubmitted than held in the queue.
MAX_JOB_WINDOW_S: Final = 7 * 24 * 3600.0

# Whole seconds, minutes or hours from 1 s up to a week (604800 s = 10080 m = 168 h), written
# out digit by digit so that the OpenAPI document can carry the exact rule: a window that
# matches is accepted, and one that does not is refused.
_WINDOW_SECONDS: Final = r"[1-9][0-9]{0,4}|[1-5][0-9]{5}|60[0-3][0-9]{3}|604[0-7][0-9]{2}|604800"
_WINDOW_MINUTES: Final = r"[1-9][0-9]{0,3}|100[0-7][0-9]|10080"
_WINDOW_HOURS: Final = r"[1-9][0-9]?|1[0-5][0-9]|16[0-8]"
COMPLETION_WINDOW_PATTERN: Final = (
    rf"^(?:(?:{_WINDOW_SECONDS})s|(?:{_WINDOW_MINUTES})m|(?:{_WINDOW_HOURS})h)$"
)
_WINDOW = re.compile(COMPLETION_WINDOW_PATTERN)
_WINDOW_UNIT_S: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}
_WINDOW_MESSAGE: Final = (
    "completion_window must be a whole number of seconds, minutes or hours followed by s, m "
    "or h (e.g. '24h'), at least 1s and at most a week (604800s, 10080m, 168h)."
)

# The string field, with its pattern in the schema (the message above stays the server's).
CompletionWindow = Annotated[
    str, WithJsonSchema({"type": "string", "pattern": COMPLETION_WINDOW_PATTERN})
]


def parse_completion_window_s(window: str) -> float:
    """``"24h"`` -> 86400.0; 1 s to a week, as ``COMPLETION_WINDOW_PATTERN`` says."""
    if _WINDOW.fullmatch(window) is None:
        raise ParamError(_WINDOW_MESSAGE)
    seconds = int(window[:-1]) * _WINDOW_UNIT_S[window[-1]]
    assert 1.0 <= seconds <= MAX_JOB_WINDOW_S
    return seconds


def _null_or(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


class JobCreateRequest(ChatCompletionRequest):
    """POST /v1/jobs: runs in the bulk class unless the key and request ask otherwise."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                *CHAT_CROSS_FIELD_RULES,
                not_both("deadline_s", "completion_window"),
            ]
        }
    )

    stream: Annotated[bool, WithJsonSchema(_null_or({"type": "boolean", "const": False}))] = False
    """Jobs do not stream: only false (or null)."""
    stream_options: Annotated[ChatStreamOptions, WithJsonSchema({"type": "null"})] | None = None
    """Jobs do not stream, so only null."""

    custom_id: Annotated[str, Field(pattern=CUSTOM_ID_PATTERN)] | None = None
    """The caller's own id for the job: 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', ':', '-'."""
    deadline_s: Annotated[float, Field(gt=0.0, le=MAX_JOB_WINDOW_S)] | None = None
    """Seconds from submission by which the job must finish; not with `completion_window`."""
    completion_window: CompletionWindow | None = None
    """The deadline as OpenAI's Batch API writes it (e.g. "24h"); not with `deadline_s`."""

    @field_validator("completion_window")
    @classmethod
    def _window_format(cls, value: str | None) -> str | None:
        if value is not None:
            parse_completion_window_s(value)
        return value

    @model_validator(mode="after")
    def _job_fields(self) -> JobCreateRequest:
        if self.stream:
            raise ParamError(
                "Jobs do not stream: poll GET /v1/jobs/{job_id}, or use /v1/chat/completions.",
                param="stream",
                code="unsupported_value",
            )
        if self.deadline_s is not None and self.completion_window is not None:
            raise ParamError(
                "Give either deadline_s or completion_window, not both.",
                param="completion_window",
            )
        return self


def job_deadline_s(req: JobCreateRequest) -> float | None:
    """Seconds from submission by which the job must finish, or None for no deadline."""
    if req.deadline_s is not None:
        return req.deadline_s
    if req.completion_window is not None:
        return parse_completion_window_s(req.completion_window)
    return None
