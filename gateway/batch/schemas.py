"""The POST /v1/batches body, validated like every other request body (OpenAI-shaped 400s)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.http.schemas import validation_error_to_api_error
from gateway.http.schemas_jobs import CompletionWindow, parse_completion_window_s
from gateway.http.schemas_sampling import Metadata, check_metadata

__all__ = ["BATCH_ENDPOINT", "BatchCreateRequest", "parse_batch_request"]

BATCH_ENDPOINT: Final = "/v1/chat/completions"
# NOTE: OpenAI accepts only "24h"; mixgate accepts any whole number of seconds, minutes or
# hours ("24h", "90m", "30s") from 1 s up to a week, because a bulk class with a measured
# envelope can promise shorter windows, and tests need them.


class BatchCreateRequest(BaseModel):
    """POST /v1/batches."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    input_file_id: Annotated[str, Field(min_length=1, max_length=256)]
    """An uploaded file (purpose "batch") of JSONL request lines."""
    endpoint: Literal["/v1/chat/completions"]
    """The endpoint every line calls; only chat completions are served."""
    completion_window: CompletionWindow
    """The deadline of every line: "24h", or any whole number of s, m or h up to a week."""
    metadata: Metadata | None = None
    """Up to 16 string pairs, echoed back."""

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        parse_completion_window_s(value)
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(value)

    @property
    def window_s(self) -> float:
        return parse_completion_window_s(self.completion_window)


def parse_batch_request(data: Any) -> BatchCreateRequest:
    try:
        return BatchCreateRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_api_error(exc) from None
