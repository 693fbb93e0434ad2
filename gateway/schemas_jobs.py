"""The bulk job request body: a chat completion body plus what a queued job needs."""

from __future__ import annotations

import re
from typing import Annotated, Final

from pydantic import Field, field_validator, model_validator

from gateway.schemas_chat import ChatCompletionRequest, ParamError

__all__ = [
    "CUSTOM_ID_PATTERN",
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

_WINDOW = re.compile(r"^([1-9][0-9]{0,8})([smh])$")
_WINDOW_UNIT_S: Final = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_completion_window_s(window: str) -> float:
    """``"24h"`` -> 86400.0; an integer above zero followed by s, m or h."""
    match = _WINDOW.fullmatch(window)
    if match is None:
        raise ParamError(
            "completion_window must be a positive integer followed by s, m or h (e.g. '24h')."
        )
    return int(match.group(1)) * _WINDOW_UNIT_S[match.group(2)]


class JobCreateRequest(ChatCompletionRequest):
    """POST /v1/jobs: runs in the bulk class unless the key and request ask otherwise."""

    custom_id: Annotated[str, Field(pattern=CUSTOM_ID_PATTERN)] | None = None
    """The caller's own id for the job: 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', ':', '-'."""
    deadline_s: Annotated[float, Field(gt=0.0, le=MAX_JOB_WINDOW_S)] | None = None
    """Seconds from submission by which the job must finish; not with `completion_window`."""
    completion_window: str | None = None
    """The deadline as OpenAI's Batch API writes it (e.g. "24h"); not with `deadline_s`."""

    @field_validator("completion_window")
    @classmethod
    def _window_format(cls, value: str | None) -> str | None:
        if value is not None and parse_completion_window_s(value) > MAX_JOB_WINDOW_S:
            raise ParamError(f"completion_window may be at most {MAX_JOB_WINDOW_S:.0f}s.")
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
