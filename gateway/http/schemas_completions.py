"""The legacy completion request body (POST /v1/completions) and its response bodies.

The decoding fields, vLLM's extensions and their rules are chat's (`SamplingRequest`); what is
this endpoint's own is the prompt: a string or a list of token ids, or a list holding one of
them (one prompt per request, as `n = 1`). OpenAI's legacy fields that mixgate cannot honour
accept only their neutral value (`echo: false`, `logprobs: null`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, WithJsonSchema, field_validator

from gateway.http.schemas import usage_body, usage_chunk, validation_error_to_api_error
from gateway.http.schemas_sampling import (
    MAX_TOKENS_BOUND,
    ParamError,
    SamplingRequest,
    integral_float_to_int,
)

__all__ = [
    "CompletionRequest",
    "completion_body",
    "completion_chunk_body",
    "parse_completion_request",
    "prompt_text_or_ids",
]

# `5.0` is the integer 5 in JSON Schema's words (and in chat's integer fields).
_TOKEN_ID = Annotated[int, Field(ge=0, le=MAX_TOKENS_BOUND), BeforeValidator(integral_float_to_int)]
_TEXT = Annotated[str, Field(min_length=1)]
_IDS = Annotated[list[_TOKEN_ID], Field(min_length=1)]
# A list of prompts is accepted only when it holds one (a batch of prompts is n > 1 choices).
_ONE_TEXT = Annotated[list[_TEXT], Field(min_length=1, max_length=1)]
_ONE_IDS = Annotated[list[_IDS], Field(min_length=1, max_length=1)]


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: _TEXT | _IDS | _ONE_TEXT | _ONE_IDS
    """The prompt as text (tokenized with the model's special tokens, as vLLM does) or as
    token ids; a list of prompts must hold exactly one."""
    echo: Annotated[bool, WithJsonSchema({"type": "boolean", "const": False})] | None = None
    """Only false (not supported otherwise)."""
    logprobs: Annotated[int, WithJsonSchema({"type": "null"})] | None = None
    """Only null (not supported otherwise)."""

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > 1 and isinstance(value[0], (str, list)):
            raise ParamError(
                "Only one prompt per request is supported (n=1): send a string, a list of "
                "token ids, or a list holding one of them.",
                code="unsupported_value",
            )
        return value

    @field_validator("echo", "logprobs")
    @classmethod
    def _neutral_legacy(cls, value: Any) -> Any:
        if value is not None and value is not False:
            raise ParamError(
                "Only the neutral value (false or null) is supported.", code="unsupported_value"
            )
        return value


def parse_completion_request(data: Any) -> CompletionRequest:
    """The validated body, or an ``APIError`` 400 naming the offending field."""
    try:
        return CompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_api_error(exc) from None


def prompt_text_or_ids(req: CompletionRequest) -> str | list[int]:
    """The one prompt, unwrapped from a list of one."""
    prompt = req.prompt
    if isinstance(prompt, str):
        return prompt
    first = prompt[0]
    if isinstance(first, int):
        return [int(t) for t in prompt]  # type: ignore[arg-type]
    return first if isinstance(first, str) else list(first)


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def completion_body(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Mapping[str, int],
) -> dict[str, Any]:
    """A non-streamed ``text_completion`` (OpenAI's legacy shape; ``created`` in Unix s)."""
    return {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [_choice(text, finish_reason)],
        "usage": usage_body(usage),
        "system_fingerprint": None,
    }


def completion_chunk_body(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One streamed ``text_completion``: text pieces, then ``text=""`` with the finish_reason,
    then (``include_usage``) ``usage=...`` with ``"choices": []``."""
    body: dict[str, Any] = {
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
    }
    if usage is not None:
        if text or finish_reason is not None:
            raise ValueError("the usage chunk carries no text and no finish_reason")
        return usage_chunk(body, usage)
    body["choices"] = [_choice(text, finish_reason)]
    return body
