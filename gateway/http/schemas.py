"""Request parsing into the pydantic models, OpenAI-style 400s, and OpenAI response bodies.

The models live in ``schemas_chat`` and ``schemas_jobs``; this module is what routes import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

from gateway.http.errors import APIError
from gateway.http.schemas_chat import ChatCompletionRequest, ChatMessage, messages_as_dicts
from gateway.http.schemas_jobs import JobCreateRequest, job_deadline_s, parse_completion_window_s
from gateway.http.schemas_sampling import ParamError, effective_max_tokens, include_usage, stop_list

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "JobCreateRequest",
    "ParamError",
    "chat_chunk_body",
    "chat_completion_body",
    "content_delta",
    "effective_max_tokens",
    "include_usage",
    "job_deadline_s",
    "messages_as_dicts",
    "parse_chat_request",
    "parse_completion_window_s",
    "parse_job_request",
    "role_delta",
    "stop_list",
    "usage_body",
    "usage_chunk",
    "validation_error_to_api_error",
]

# ---- parsing --------------------------------------------------------------------------------


def parse_chat_request(data: Any) -> ChatCompletionRequest:
    """The validated chat body, or an ``APIError`` 400 naming the offending field."""
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_api_error(exc) from None


def parse_job_request(data: Any) -> JobCreateRequest:
    """The validated job body, or an ``APIError`` 400 naming the offending field."""
    try:
        return JobCreateRequest.model_validate(data)
    except ValidationError as exc:
        raise validation_error_to_api_error(exc) from None


# OpenAI parameters mixgate knows of but does not implement: "not supported" says more than
# "unrecognized" to a client that sent a valid OpenAI request.
_KNOWN_UNSUPPORTED: Final = frozenset(
    {
        "audio",
        "best_of",
        "function_call",
        "functions",
        "logit_bias",
        "modalities",
        "parallel_tool_calls",
        "prediction",
        "reasoning_effort",
        "store",
        "suffix",
        "top_logprobs",
        "web_search_options",
    }
)

# vLLM's request extensions that mixgate does not implement (README: vLLM request extensions):
# refused by name rather than as unknown, so a vLLM user sees what to drop. The ones it
# implements are fields of SamplingRequest.
_VLLM_UNIMPLEMENTED: Final = frozenset(
    {
        "add_generation_prompt",
        "add_special_tokens",
        "allowed_token_ids",
        "bad_words",
        "chat_template",
        "chat_template_kwargs",
        "continue_final_message",
        "guided_choice",
        "guided_decoding_backend",
        "guided_grammar",
        "guided_json",
        "guided_regex",
        "guided_whitespace_pattern",
        "include_stop_str_in_output",
        "length_penalty",
        "logits_processors",
        "priority",
        "prompt_logprobs",
        "return_tokens_as_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "structured_outputs",
        "truncate_prompt_tokens",
        "use_beam_search",
        "vllm_xargs",
    }
)

# Pydantic's error type -> what the value should have been, in JSON's words.
_EXPECTED: Final[Mapping[str, str]] = {
    "int_type": "an integer",
    "string_type": "a string",
    "bool_type": "a boolean",
    "float_type": "a number",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}

# Pydantic puts the union member's name (``str``, ``list[TextPart]``) into an error's location;
# field names here are snake_case, so anything else (or a bare type name) is such a tag.
_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*")
_TYPE_TAGS: Final = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})
_MAX_PARAM_CHARS: Final = 128
_Error = Mapping[str, Any]


def _is_tag(part: str | int) -> bool:
    return isinstance(part, str) and (_FIELD_NAME.fullmatch(part) is None or part in _TYPE_TAGS)


def _clean_loc(error: _Error) -> tuple[str | int, ...]:
    loc: tuple[str | int, ...] = tuple(error["loc"])
    if error["type"] == "extra_forbidden":
        # The last element is the client's unknown key, whatever it looks like.
        return tuple(p for p in loc[:-1] if not _is_tag(p)) + loc[-1:]
    return tuple(p for p in loc if not _is_tag(p))


def _param(loc: Sequence[str | int]) -> str | None:
    if not loc:
        return None
    return ".".join(str(part) for part in loc)[:_MAX_PARAM_CHARS]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for kind, name in (
        (bool, "a boolean"),  # before int: bool is an int subclass
        (int, "an integer"),
        (float, "a number"),
        (str, "a string"),
        (list, "an array"),
        (dict, "an object"),
    ):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _is_type_error(error: _Error) -> bool:
    return str(error["type"]) in _EXPECTED


def _primary_error(errors: Sequence[_Error]) -> tuple[_Error, list[_Error]]:
    """The error to report, and the union alternatives it was chosen from (empty if none).

    For a union (``content``: string or parts), pydantic reports one error per member. The
    deepest error wins (the client clearly meant that member), then a constraint error over a
    type error ("at most 4 items" beats "expected a string").
    """
    first = errors[0]
    loc = tuple(first["loc"])
    tag_at = next((i for i, part in enumerate(loc) if _is_tag(part)), None)
    if tag_at is None or first["type"] == "extra_forbidden":
        return first, []
    prefix = loc[:tag_at]
    alternatives = [
        e
        for e in errors
        if tuple(e["loc"][:tag_at]) == prefix
        and len(e["loc"]) > tag_at
        and _is_tag(e["loc"][tag_at])
    ]
    best = max(alternatives, key=lambda e: (len(_clean_loc(e)), not _is_type_error(e)))
    return best, alternatives


def _type_message(param: str | None, error: _Error, alternatives: Sequence[_Error]) -> str:
    subject = f"'{param}'" if param else "the request body"
    expected = [_EXPECTED[str(e["type"])] for e in alternatives if _is_type_error(e)]
    if not expected or len(expected) < len(alternatives):
        expected = [_EXPECTED[str(error["type"])]]
    wanted = " or ".join(dict.fromkeys(expected))  # unique, in order
    got = _json_type(error["input"])
    return f"Invalid type for {subject}: expected {wanted}, but got {got} instead."


def _strip_prefix(message: str) -> str:
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            return message[len(prefix) :]
    return message


def _message_and_code(
    param: str | None, error: _Error, alternatives: Sequence[_Error]
) -> tuple[str, str]:
    kind = str(error["type"])
    subject = f"'{param}'" if param else "the request body"
    if kind == "missing":
        return f"Missing required parameter: {subject}.", "missing_required_parameter"
    if kind == "extra_forbidden":
        if param in _KNOWN_UNSUPPORTED:
            return f"'{param}' is not supported by this server.", "unsupported_parameter"
        if param in _VLLM_UNIMPLEMENTED:
            message = f"'{param}' (a vLLM extension) is not implemented by this server."
            return message, "unsupported_parameter"
        if param is not None and "." not in param:
            return f"Unrecognized request argument supplied: {param}", "unknown_parameter"
        return f"Unrecognized argument: {subject}.", "unknown_parameter"
    if kind in _EXPECTED:
        return _type_message(param, error, alternatives), "invalid_type"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "one of the allowed values")
        return f"Invalid value for {subject}: expected {expected}.", "invalid_value"
    text = _strip_prefix(str(error["msg"]))
    if kind == "value_error":
        return text, "invalid_value"
    return f"Invalid value for {subject}: {text.rstrip('.')}.", "invalid_value"


def validation_error_to_api_error(exc: ValidationError) -> APIError:
    """One 400 for the most useful of pydantic's errors, shaped like OpenAI's."""
    errors = exc.errors(include_url=False)
    if not errors:  # pragma: no cover - pydantic never raises an empty ValidationError
        return APIError.invalid_request("Invalid request body.")
    error, alternatives = _primary_error(errors)
    param = _param(_clean_loc(error))
    message, code = _message_and_code(param, error, alternatives)
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, ParamError):
        param = cause.param or param
        code = cause.code
    return APIError.invalid_request(message, param=param, code=code)


# ---- response bodies, byte-compatible with OpenAI's ------------------------------------------


def usage_body(usage: Mapping[str, int]) -> dict[str, int]:
    """``{prompt_tokens, completion_tokens, total_tokens}`` from a mapping with the first two."""
    prompt_tokens = int(usage["prompt_tokens"])
    completion_tokens = int(usage["completion_tokens"])
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion_body(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Mapping[str, int],
    *,
    system_fingerprint: str | None = None,
    service_tier: str | None = "default",
) -> dict[str, Any]:
    """A non-streamed ``chat.completion``; ``created`` is Unix seconds, as OpenAI's is."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage_body(usage),
        "service_tier": service_tier,
        "system_fingerprint": system_fingerprint,
    }


def role_delta() -> dict[str, str]:
    """The first chunk's delta."""
    return {"role": "assistant", "content": ""}


def content_delta(text: str) -> dict[str, str]:
    return {"content": text}


def chat_chunk_body(
    id: str,
    created: int,
    model: str,
    delta: Mapping[str, str],
    finish_reason: str | None,
    usage: Mapping[str, int] | None = None,
    *,
    include_usage: bool = False,
    system_fingerprint: str | None = None,
    service_tier: str | None = "default",
) -> dict[str, Any]:
    """One ``chat.completion.chunk``, in OpenAI's stream order:

    1. ``delta=role_delta()``; 2. ``delta=content_delta(text)`` per piece; 3. ``delta={}`` with
    the ``finish_reason``; 4. only with ``stream_options.include_usage``: ``usage=...``, which
    gives ``"choices": []``. With ``include_usage`` every other chunk carries ``"usage": null``,
    as OpenAI's do.
    """
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "service_tier": service_tier,
        "system_fingerprint": system_fingerprint,
    }
    if usage is not None:
        if delta or finish_reason is not None:
            raise ValueError("the usage chunk carries no delta and no finish_reason")
        return usage_chunk(body, usage)
    body["choices"] = [
        {"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}
    ]
    if include_usage:
        body["usage"] = None
    return body


def usage_chunk(envelope: dict[str, Any], usage: Mapping[str, int]) -> dict[str, Any]:
    """The stream's last chunk with ``stream_options.include_usage``: ``envelope`` (the id,
    object, created, model fields of the stream's chunks) with no choices and the usage, as
    OpenAI sends it for chat and legacy completions alike."""
    envelope["choices"] = []
    envelope["usage"] = usage_body(usage)
    return envelope
