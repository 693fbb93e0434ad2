"""What chat and legacy completions share in a request body: the model, streaming, decoding
settings, vLLM's request extensions that mixgate implements, and the validation helpers every
body model uses (the chat body: schemas_chat.py; legacy completions: schemas_completions.py).

Models are strict: ``"max_tokens": "5"`` is a type error as in OpenAI's API, not a silent cast.
Unknown fields are rejected ("Unrecognized request argument supplied"), as OpenAI does, so a
typo such as ``max_token`` is a 400 rather than a request that runs with the default. Fields that
OpenAI defines but mixgate cannot honour accept only their neutral value (``n=1``, zero
penalties, ``logprobs=false``, no tools) and reject anything else, never ignore it.

The JSON schema of each model is the OpenAPI document's request body, so every rule the
validators enforce is also written into the schema (``WithJsonSchema``, the model's ``allOf``):
a client, or a fuzzer, that follows the document is never refused, and one that breaks it is.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

__all__ = [
    "CHAT_CROSS_FIELD_RULES",
    "INTEGRAL",
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "MAX_STOP_TOKEN_IDS",
    "Metadata",
    "NullableFalse",
    "ParamError",
    "SAMPLING_CROSS_FIELD_RULES",
    "STRICT_MODEL_CONFIG",
    "SamplingRequest",
    "StreamOptions",
    "check_metadata",
    "effective_max_tokens",
    "include_usage",
    "integral_float_to_int",
    "not_both",
    "null_or_absent",
    "short_repr",
    "stop_list",
    "unsupported_param",
]

# OpenAI's limit; the engine allows more, but a client written against OpenAI never needs it.
MAX_STOP_STRINGS: Final = 4
# The engine searches the tail of the output for each stop string every token.
MAX_STOP_STRING_CHARS: Final = 256
# OpenAI's metadata bounds.
MAX_METADATA_KEYS: Final = 16
MAX_METADATA_KEY_CHARS: Final = 64
MAX_METADATA_VALUE_CHARS: Final = 512
# NOTE: token counts travel through Redis Lua scripts, whose numbers are doubles; keeping them
# within int32 keeps every sum exact. The envelope's real output limit is far lower (413).
MAX_TOKENS_BOUND: Final = 2**31 - 1
# The engine's per-request seed is a non-negative 63-bit integer.
MAX_SEED: Final = 2**63 - 1


class ParamError(ValueError):
    """A validation failure that knows which field it is about.

    Pydantic reports errors from model-level validators at the model's location; raising this
    lets the 400 still name the field (``param``) and a specific ``code``.
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.param = param
        self.code = code


def short_repr(value: Any, limit_chars: int = 40) -> str:
    # Client values in messages are shortened: an error should never echo a megabyte back.
    text = repr(value)
    return text if len(text) <= limit_chars else text[: limit_chars - 3] + "..."


def integral_float_to_int(value: Any) -> Any:
    """``5.0`` -> ``5``: JSON Schema calls an integral number an integer, and so does OpenAI's
    API (``"seed": 1329118.0`` is accepted there); strict pydantic would refuse the float."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# Last in an int field's Annotated (after Field(ge=...)), so that pydantic still writes the
# bounds as JSON Schema's minimum/maximum (before them it writes raw `ge`/`le`).
INTEGRAL: Final = BeforeValidator(integral_float_to_int)


def null_or_absent(*names: str) -> dict[str, Any]:
    """JSON Schema: none of these fields has a value (each is absent or null)."""
    return {"properties": {name: {"type": "null"} for name in names}}


def not_both(first: str, second: str) -> dict[str, Any]:
    """JSON Schema: at most one of the two fields has a value. Written as ``anyOf`` rather
    than ``if``/``then``, which schema-driven generators (schemathesis) honour less reliably."""
    return {"anyOf": [null_or_absent(first), null_or_absent(second)]}


def unsupported_param(param: str, why: str = "") -> ParamError:
    return ParamError(
        f"'{param}' is not supported by this server{why}.", param, "unsupported_parameter"
    )


STRICT_MODEL_CONFIG: Final = ConfigDict(
    extra="forbid",
    strict=True,
    frozen=True,
    allow_inf_nan=False,
    use_attribute_docstrings=True,
)


class StreamOptions(BaseModel):
    model_config = STRICT_MODEL_CONFIG

    include_usage: bool | None = None
    """Send a last chunk with empty `choices` and the request's token usage."""
    continuous_usage_stats: bool | None = None
    """vLLM extension: every chunk carries the usage so far (with `include_usage`)."""


_StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]
_StopList = Annotated[list[_StopString], Field(max_length=MAX_STOP_STRINGS)]

# What check_metadata enforces, in the schema's words.
Metadata = Annotated[
    dict[str, str],
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_METADATA_KEYS,
            "propertyNames": {"maxLength": MAX_METADATA_KEY_CHARS},
            "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS},
        }
    ),
]
# `null` means the default (False), as in OpenAI's schema.
NullableFalse = Annotated[bool, WithJsonSchema({"type": ["boolean", "null"]})]


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """OpenAI's bounds, so that metadata stored with a job stays small and predictable."""
    if metadata is None:
        return None
    if len(metadata) > MAX_METADATA_KEYS:
        raise ParamError(f"metadata may have at most {MAX_METADATA_KEYS} keys.")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise ParamError(f"metadata keys may be at most {MAX_METADATA_KEY_CHARS} characters.")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise ParamError(
                f"metadata values may be at most {MAX_METADATA_VALUE_CHARS} characters."
            )
    return metadata


# The cross-field rules of `SamplingRequest._cross_field`, as JSON Schema (the model's `allOf`).
SAMPLING_CROSS_FIELD_RULES: Final[tuple[JsonDict, ...]] = (
    {
        "anyOf": [
            null_or_absent("stream_options"),
            {"required": ["stream"], "properties": {"stream": {"const": True}}},
        ]
    },
    not_both("max_tokens", "max_completion_tokens"),
    {
        "anyOf": [
            null_or_absent("stop"),
            {"properties": {"min_tokens": {"anyOf": [{"type": "null"}, {"const": 0}]}}},
        ]
    },
)
# Kept under its old name: the job and batch bodies extend the chat body's rules.
CHAT_CROSS_FIELD_RULES: Final = SAMPLING_CROSS_FIELD_RULES
# The most stop token ids one request may carry (each is compared with every sampled token).
MAX_STOP_TOKEN_IDS: Final = 64


class SamplingRequest(BaseModel):
    """What chat and legacy completions share: the model, streaming, decoding settings, and
    vLLM's request extensions that mixgate implements (README: vLLM request extensions)."""

    model_config = ConfigDict(
        **STRICT_MODEL_CONFIG, json_schema_extra={"allOf": [*SAMPLING_CROSS_FIELD_RULES]}
    )

    model: Annotated[str, Field(min_length=1, max_length=256)]
    stream: NullableFalse = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_BOUND), INTEGRAL] | None = None
    """OpenAI's deprecated alias of `max_completion_tokens`; not with it (as OpenAI's API)."""
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_BOUND), INTEGRAL] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: (
        Annotated[
            int,
            INTEGRAL,
            WithJsonSchema(
                {"anyOf": [{"type": "integer", "const": -1}, {"type": "integer", "minimum": 1}]}
            ),
        ]
        | None
    ) = None
    """mixgate/vLLM extension: keep the k most likely tokens; -1 keeps all."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED), INTEGRAL] | None = None
    stop: _StopString | _StopList | None = None
    """A string, or up to 4 non-empty strings, that end generation (not part of the output)."""
    n: Annotated[int, INTEGRAL, WithJsonSchema({"type": "integer", "const": 1})] | None = None
    """Only 1: one choice per request."""
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    """`flex` runs the request in the bulk class, `priority` in the interactive class."""
    presence_penalty: Annotated[float, WithJsonSchema({"type": "number", "const": 0})] | None = None
    """Only 0 (not supported otherwise)."""
    frequency_penalty: Annotated[float, WithJsonSchema({"type": "number", "const": 0})] | None = (
        None
    )
    """Only 0 (not supported otherwise)."""
    user: Annotated[str, Field(max_length=256)] | None = None
    ignore_eos: NullableFalse = False
    """vLLM extension: keep generating past the end-of-sequence token."""
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_BOUND), INTEGRAL] | None = None
    """vLLM extension: EOS and `stop_token_ids` cannot end the output before this many tokens
    (at most the output limit; not with `stop` strings)."""
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    """vLLM extension: drop tokens less likely than `min_p` times the most likely one."""
    repetition_penalty: Annotated[float, Field(gt=0.0, le=2.0)] | None = None
    """vLLM extension: >1 makes tokens of the prompt and output so far less likely (1 is off)."""
    stop_token_ids: (
        Annotated[
            list[Annotated[int, Field(ge=0, le=MAX_TOKENS_BOUND), INTEGRAL]],
            Field(max_length=MAX_STOP_TOKEN_IDS),
        ]
        | None
    ) = None
    """vLLM extension: token ids that end generation (the id's text is not part of the output)."""

    @field_validator("stream", "ignore_eos", mode="before")
    @classmethod
    def _null_is_false(cls, value: Any) -> Any:
        # OpenAI's schema makes these nullable; null means the default.
        return False if value is None else value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ParamError(
                "Only n=1 is supported: this server returns one choice per request.",
                code="unsupported_value",
            )
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _neutral_only(cls, value: float | bool | None) -> float | bool | None:
        if value:  # 0, 0.0, False and None are the neutral values
            raise ParamError(
                "Only the neutral value (0 or false) is supported.", code="unsupported_value"
            )
        return value

    @field_validator("top_k")
    @classmethod
    def _top_k_range(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value < 1:
            raise ParamError("top_k must be -1 (keep all tokens) or at least 1.")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> SamplingRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            # NOTE: refused as OpenAI's API refuses it, rather than one silently winning: guessing
            # wrong changes cost and latency (max_tokens is the deprecated alias).
            raise ParamError(
                "Setting 'max_tokens' and 'max_completion_tokens' at the same time is not "
                "supported.",
                param="max_tokens",
                code="invalid_parameter_combination",
            )
        if self.stream_options is not None and not self.stream:
            raise ParamError(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        if self.min_tokens and self.stop is not None:
            # NOTE: vLLM ignores stop strings before min_tokens; mixgate's detokenizer cuts the
            # text at the first match, so the pair is refused rather than half honoured.
            raise ParamError(
                "'min_tokens' together with 'stop' strings is not supported.",
                param="min_tokens",
                code="invalid_parameter_combination",
            )
        return self


# ---- what the rest of the gateway reads from a request ---------------------------------------


def stop_list(req: SamplingRequest) -> tuple[str, ...]:
    if req.stop is None:
        return ()
    if isinstance(req.stop, str):
        return (req.stop,)
    return tuple(req.stop)


def effective_max_tokens(req: SamplingRequest, default: int) -> int:
    """The output limit asked for, or the server's default when the client gave none."""
    if req.max_completion_tokens is not None:
        return req.max_completion_tokens
    if req.max_tokens is not None:
        return req.max_tokens
    return default


def include_usage(req: SamplingRequest) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
    return bool(req.stream_options is not None and req.stream_options.include_usage)
