"""Request bodies (valid and each kind of invalid) and response bodies (the OpenAPI document:
test_openapi_document.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import gateway.http.openapi as openapi_module
import gateway.http.schemas as schemas_module
from gateway.http.errors import APIError
from gateway.http.schemas import (
    ChatCompletionRequest,
    chat_chunk_body,
    chat_completion_body,
    content_delta,
    effective_max_tokens,
    include_usage,
    job_deadline_s,
    messages_as_dicts,
    parse_chat_request,
    parse_completion_window_s,
    parse_job_request,
    role_delta,
    stop_list,
)

BASE: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}


def _chat_error(body: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_chat_request(body)
    assert caught.value.status == 400
    assert caught.value.type == "invalid_request_error"
    return caught.value


def _job_error(body: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_job_request(body)
    assert caught.value.status == 400
    return caught.value


def test_all_names_exist() -> None:
    for module in (schemas_module, openapi_module):
        for name in module.__all__:
            assert hasattr(module, name), name


# ---- valid chat bodies ----------------------------------------------------------------------


def test_minimal_body_parses_with_defaults() -> None:
    req = parse_chat_request(BASE)
    assert req.model == "tiny"
    assert req.stream is False
    assert stop_list(req) == ()
    assert effective_max_tokens(req, default=256) == 256
    assert include_usage(req) is False
    assert messages_as_dicts(req) == [{"role": "user", "content": "Hi"}]


def test_full_body_parses() -> None:
    body = {
        **BASE,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Really."},
            {"role": "user", "name": "ann",
             "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 64,
        "temperature": 0,  # an integer is a valid number
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "stop": ["\n\n", "END"],
        "n": 1,
        "service_tier": "flex",
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logprobs": False,
        "user": "u-1",
        "metadata": {"team": "search"},
        "response_format": {"type": "text"},
        "tools": [],
        "tool_choice": "none",
        "ignore_eos": True,
    }  # fmt: skip
    req = parse_chat_request(body)
    assert req.temperature == 0.0
    assert req.service_tier == "flex"
    assert req.ignore_eos is True
    assert include_usage(req) is True
    assert stop_list(req) == ("\n\n", "END")
    assert effective_max_tokens(req, default=256) == 64
    assert messages_as_dicts(req)[2] == {"role": "user", "name": "ann", "content": "a\nb"}


def test_single_stop_string_and_max_tokens_alias() -> None:
    req = parse_chat_request({**BASE, "stop": "###", "max_tokens": 5})
    assert stop_list(req) == ("###",)
    assert effective_max_tokens(req, default=256) == 5


def test_integral_floats_are_integers_as_in_json_schema() -> None:
    # JSON Schema (and OpenAI's API) call 1329118.0 an integer; the engine gets a Python int.
    req = parse_chat_request({**BASE, "seed": 1329118.0, "max_tokens": 5.0, "n": 1.0})
    assert (req.seed, req.max_tokens, req.n) == (1329118, 5, 1)
    assert isinstance(req.seed, int)
    assert parse_chat_request({**BASE, "top_k": -1.0}).top_k == -1


def test_null_means_default() -> None:
    req = parse_chat_request({**BASE, "stream": None, "temperature": None, "n": None, "stop": None})
    assert req.stream is False
    assert req.temperature is None


# ---- invalid chat bodies --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "param", "code"),
    [
        ({"model": None}, "model", "invalid_type"),
        ({"model": ""}, "model", "invalid_value"),
        ({"messages": []}, "messages", "invalid_value"),
        ({"messages": "Hi"}, "messages", "invalid_type"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0.role", "invalid_value"),
        ({"messages": [{"role": "user"}]}, "messages.0.content", "missing_required_parameter"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "invalid_type"),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0.content", "invalid_value"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content.0.type",
            "unsupported_value",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
            "missing_required_parameter",
        ),
        ({"messages": [{"role": "user", "content": "x", "x": 1}]}, "messages.0.x",
         "unknown_parameter"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"max_tokens": "5"}, "max_tokens", "invalid_type"),
        ({"max_tokens": 5.5}, "max_tokens", "invalid_type"),
        ({"max_tokens": True}, "max_tokens", "invalid_type"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "invalid_value"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens",
         "invalid_parameter_combination"),
        ({"max_tokens": 5, "max_completion_tokens": 5}, "max_tokens",
         "invalid_parameter_combination"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"temperature": -0.1}, "temperature", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"top_p": 1.5}, "top_p", "invalid_value"),
        ({"top_k": 0}, "top_k", "invalid_value"),
        ({"top_k": -2}, "top_k", "invalid_value"),
        ({"seed": -1}, "seed", "invalid_value"),
        ({"seed": 2**63}, "seed", "invalid_value"),
        ({"stop": ""}, "stop", "invalid_value"),
        ({"stop": ["a", ""]}, "stop.1", "invalid_value"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "invalid_value"),
        ({"stop": ["x" * 257]}, "stop.0", "invalid_value"),
        ({"stop": 5}, "stop", "invalid_type"),
        ({"n": 2}, "n", "unsupported_value"),
        ({"n": 0}, "n", "unsupported_value"),
        ({"service_tier": "scale"}, "service_tier", "invalid_value"),
        ({"presence_penalty": 0.5}, "presence_penalty", "unsupported_value"),
        ({"frequency_penalty": -1}, "frequency_penalty", "unsupported_value"),
        ({"logprobs": True}, "logprobs", "unsupported_value"),
        ({"user": 5}, "user", "invalid_type"),
        ({"metadata": {"k": 1}}, "metadata.k", "invalid_type"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "invalid_value"),
        ({"metadata": {"k": "v" * 513}}, "metadata", "invalid_value"),
        ({"response_format": {"type": "json_object"}}, "response_format", "unsupported_value"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format",
         "unsupported_value"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
         "unsupported_parameter"),
        ({"tools": {}}, "tools", "invalid_type"),
        ({"tool_choice": "auto"}, "tool_choice", "unsupported_parameter"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "unsupported_parameter"),
        ({"ignore_eos": 1}, "ignore_eos", "invalid_type"),
        ({"max_token": 5}, "max_token", "unknown_parameter"),
    ],
)  # fmt: skip
def test_invalid_chat_body_names_the_param(patch: dict[str, Any], param: str, code: str) -> None:
    error = _chat_error({**BASE, **patch})
    assert (error.param, error.code) == (param, code), error.message


def test_missing_required_fields() -> None:
    error = _chat_error({"model": "tiny"})
    assert (error.param, error.code) == ("messages", "missing_required_parameter")
    assert error.message == "Missing required parameter: 'messages'."
    assert _chat_error({"messages": BASE["messages"]}).param == "model"


def test_messages_read_like_openais() -> None:
    error = _chat_error({**BASE, "max_tokens": "5"})
    assert error.message == (
        "Invalid type for 'max_tokens': expected an integer, but got a string instead."
    )
    error = _chat_error({**BASE, "messages": [{"role": "user", "content": 5}]})
    assert error.message == (
        "Invalid type for 'messages.0.content': expected a string or an array, "
        "but got an integer instead."
    )


def test_unknown_field_is_rejected_like_openai() -> None:
    error = _chat_error({**BASE, "frobnicate": True})
    assert error.param == "frobnicate"
    assert error.message == "Unrecognized request argument supplied: frobnicate"


def test_body_must_be_an_object() -> None:
    for body in ([BASE], "text", None):
        assert _chat_error(body).param is None


def test_ten_thousand_stop_strings_are_rejected_without_echo() -> None:
    error = _chat_error({**BASE, "stop": ["stop-word"] * 10_000})
    assert error.param == "stop"
    assert "stop-word" not in error.message
    assert len(error.message) < 200


def test_huge_unknown_key_is_truncated_in_param() -> None:
    error = _chat_error({**BASE, "k" * 10_000: 1})
    assert error.param is not None and len(error.param) <= 128


# ---- jobs -----------------------------------------------------------------------------------


def test_job_body_parses() -> None:
    req = parse_job_request(
        {**BASE, "custom_id": "req-1:a.b_c", "completion_window": "24h", "metadata": {"k": "v"}}
    )
    assert isinstance(req, ChatCompletionRequest)  # the chat helpers apply to jobs too
    assert req.custom_id == "req-1:a.b_c"
    assert job_deadline_s(req) == 86_400.0
    assert messages_as_dicts(req) == [{"role": "user", "content": "Hi"}]
    assert job_deadline_s(parse_job_request({**BASE, "deadline_s": 90.5})) == 90.5
    assert job_deadline_s(parse_job_request(BASE)) is None
    assert parse_job_request({**BASE, "stream": False}).stream is False


@pytest.mark.parametrize(
    ("window", "seconds"), [("1s", 1.0), ("90s", 90.0), ("15m", 900.0), ("24h", 86_400.0)]
)
def test_completion_window_parsing(window: str, seconds: float) -> None:
    assert parse_completion_window_s(window) == seconds


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"custom_id": "a\r\nX-Injected: 1"}, "custom_id"),
        ({"custom_id": ""}, "custom_id"),
        ({"custom_id": "x" * 65}, "custom_id"),
        ({"custom_id": "has space"}, "custom_id"),
        ({"custom_id": "a/b"}, "custom_id"),
        ({"custom_id": 5}, "custom_id"),
        ({"stream": True}, "stream"),
        ({"deadline_s": 0}, "deadline_s"),
        ({"deadline_s": -5}, "deadline_s"),
        ({"deadline_s": 1e300}, "deadline_s"),
        ({"deadline_s": "60"}, "deadline_s"),
        ({"deadline_s": 60, "completion_window": "1h"}, "completion_window"),
        ({"completion_window": "0h"}, "completion_window"),
        ({"completion_window": "24"}, "completion_window"),
        ({"completion_window": "24d"}, "completion_window"),
        ({"completion_window": "-1h"}, "completion_window"),
        ({"completion_window": "1.5h"}, "completion_window"),
        ({"completion_window": " 24h"}, "completion_window"),
        ({"completion_window": "169h"}, "completion_window"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"n": 3}, "n"),
        ({"batch": 1}, "batch"),
    ],
)
def test_invalid_job_body_names_the_param(patch: dict[str, Any], param: str) -> None:
    error = _job_error({**BASE, **patch})
    assert error.param == param, error.message
    assert "\r" not in error.message and "\n" not in error.message


def test_chat_rejects_job_fields() -> None:
    assert _chat_error({**BASE, "custom_id": "a"}).code == "unknown_parameter"


# ---- response bodies ------------------------------------------------------------------------

USAGE = {"prompt_tokens": 7, "completion_tokens": 3}


def test_chat_completion_body_has_exactly_openais_keys() -> None:
    body = chat_completion_body("chatcmpl-1", 1_700_000_000, "tiny", "Hello", "stop", USAGE)
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "service_tier",
        "system_fingerprint",
    ]
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    json.dumps(body)  # plain JSON


def test_chunk_bodies_follow_openais_stream() -> None:
    args = ("chatcmpl-1", 1_700_000_000, "tiny")
    first = chat_chunk_body(*args, role_delta(), None)
    middle = chat_chunk_body(*args, content_delta("Hel"), None)
    last = chat_chunk_body(*args, {}, "length")
    keys = ["id", "object", "created", "model", "service_tier", "system_fingerprint", "choices"]
    for chunk in (first, middle, last):
        assert list(chunk) == keys
        assert chunk["object"] == "chat.completion.chunk"
        assert list(chunk["choices"][0]) == ["index", "delta", "logprobs", "finish_reason"]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert middle["choices"][0]["delta"] == {"content": "Hel"}
    assert last["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
    }
    # With stream_options.include_usage: "usage": null on every chunk, then a usage chunk.
    assert chat_chunk_body(*args, content_delta("x"), None, include_usage=True)["usage"] is None
    usage_chunk = chat_chunk_body(*args, {}, None, USAGE)
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    with pytest.raises(ValueError):
        chat_chunk_body(*args, content_delta("x"), None, USAGE)


def test_bodies_parse_with_the_openai_sdk() -> None:
    chat_types = pytest.importorskip("openai.types.chat")
    completion = chat_types.ChatCompletion.model_validate(
        chat_completion_body("chatcmpl-1", 1, "tiny", "Hello", "stop", USAGE)
    )
    assert completion.choices[0].message.content == "Hello"
    for chunk in (
        chat_chunk_body("chatcmpl-1", 1, "tiny", role_delta(), None),
        chat_chunk_body("chatcmpl-1", 1, "tiny", {}, "stop"),
        chat_chunk_body("chatcmpl-1", 1, "tiny", {}, None, USAGE),
    ):
        chat_types.ChatCompletionChunk.model_validate(chunk)
