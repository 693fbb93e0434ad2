"""The chat completion request body: messages, chat's stream options and response format, on
top of what chat shares with legacy completions (schemas_sampling.py).

The rules every body model follows (strict types, unknown fields refused as OpenAI does,
OpenAI's fields that mixgate cannot honour accepted only at their neutral value, every
validator's rule written into the JSON schema) are schemas_sampling.py's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "ChatStreamOptions",
    "ResponseFormat",
    "TextPart",
    "messages_as_dicts",
]

from gateway.http.schemas_sampling import (
    STRICT_MODEL_CONFIG,
    Metadata,
    ParamError,
    SamplingRequest,
    StreamOptions,
    check_metadata,
    short_repr,
    unsupported_param,
)


class TextPart(BaseModel):
    """A content part; mixgate serves text models, so text is the only kind."""

    model_config = STRICT_MODEL_CONFIG

    type: Literal["text"]
    text: str

    @field_validator("type", mode="before")
    @classmethod
    def _only_text(cls, value: Any) -> Any:
        if value != "text":
            raise ParamError(
                f"Content parts of type {short_repr(value)} are not supported; only 'text' is.",
                code="unsupported_value",
            )
        return value


class ChatMessage(BaseModel):
    model_config = STRICT_MODEL_CONFIG

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    """The text, or a list of text parts (joined with newlines for the chat template)."""
    name: Annotated[str, Field(min_length=1, max_length=64)] | None = None


class ChatStreamOptions(StreamOptions):
    """A chat's stream options: OpenAI's and vLLM's, and whether the stream is resumable."""

    resumable: bool | None = None
    """mixgate extension: a client that leaves does not cancel the generation at once; it may
    resume with `GET /v1/chat/completions/{id}/stream` and `Last-Event-ID` within the
    server's grace time (`MIXGATE_STREAM_RESUME_GRACE_S`)."""


class ResponseFormat(BaseModel):
    model_config = STRICT_MODEL_CONFIG

    type: Literal["text"]


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    stream_options: ChatStreamOptions | None = None
    logprobs: Annotated[bool, WithJsonSchema({"type": "boolean", "const": False})] | None = None
    """Only false (not supported otherwise)."""
    metadata: Metadata | None = None
    """At most 16 keys of at most 64 characters, values of at most 512 characters."""
    response_format: ResponseFormat | None = None
    """Only `{"type": "text"}`."""
    tools: Annotated[list[Any], WithJsonSchema({"type": "array", "maxItems": 0})] | None = None
    """Not supported: only absent, null or `[]` (a tool is a 400 `unsupported_parameter`)."""
    tool_choice: Annotated[
        Any, WithJsonSchema({"anyOf": [{"type": "string", "const": "none"}, {"type": "null"}]})
    ] = None
    """Not supported: only absent, null or "none" (else a 400 `unsupported_parameter`)."""

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ParamError(
                "Only the neutral value (0 or false) is supported.", code="unsupported_value"
            )
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        return check_metadata(value)

    @field_validator("response_format", mode="before")
    @classmethod
    def _text_format_only(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("type") not in (None, "text"):
            raise ParamError(
                f"response_format type {short_repr(value.get('type'))} is not supported; "
                "only 'text' is.",
                code="unsupported_value",
            )
        return value

    @model_validator(mode="after")
    def _no_tools(self) -> ChatCompletionRequest:
        if self.tools:
            raise unsupported_param("tools", ": mixgate serves plain text completions")
        if self.tool_choice not in (None, "none"):
            raise unsupported_param("tool_choice", ": mixgate serves plain text completions")
        return self


# ---- what the rest of the gateway reads from a request ---------------------------------------


def messages_as_dicts(req: ChatCompletionRequest) -> list[dict[str, str]]:
    """The messages as the chat template expects them: ``{"role", "content"[, "name"]}``.

    Text parts are joined with newlines, as vLLM does, so a list of parts and the same text as
    one string give the same prompt.
    """
    result: list[dict[str, str]] = []
    for message in req.messages:
        if isinstance(message.content, str):
            content = message.content
        else:
            content = "\n".join(part.text for part in message.content)
        entry = {"role": message.role, "content": content}
        if message.name is not None:
            entry["name"] = message.name
        result.append(entry)
    return result
