"""Request bodies (valid and each kind of invalid), response bodies, and the OpenAPI document."""

from __future__ import annotations

import json
from typing import Any

import pytest

import gateway.openapi as openapi_module
import gateway.schemas as schemas_module
from gateway.errors import APIError
from gateway.openapi import DOCUMENTED_OPERATIONS, build_openapi, hoist_defs
from gateway.schemas import (
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


# ---- the OpenAPI document -------------------------------------------------------------------


def _resolve(doc: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"unresolved {ref}"
        node = node[part]
    return node


def _walk(node: Any, path: str = "") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            found.append((f"{path}/{key}", key))
            found.extend(_walk(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found.extend(_walk(item, f"{path}/{i}"))
    return found


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    return []


def test_openapi_document_is_well_formed() -> None:
    doc = build_openapi()
    json.dumps(doc)
    assert doc["openapi"].startswith("3.1")
    assert {"title", "version"} <= set(doc["info"])
    methods = {"get", "post", "put", "delete", "patch"}
    operation_ids: list[str] = []
    for path, item in doc["paths"].items():
        operations = {m: op for m, op in item.items() if m in methods}
        assert operations, path
        for method, operation in operations.items():
            responses = operation["responses"]
            assert responses, f"{method} {path} has no responses"
            assert any(code.startswith("2") for code in responses), f"{method} {path}"
            operation_ids.append(operation["operationId"])
        if "{job_id}" in path:
            assert item["parameters"][0]["name"] == "job_id"
    assert len(operation_ids) == len(set(operation_ids))
    refs = _refs(doc)
    assert refs
    for ref in refs:
        _resolve(doc, ref)
    # Pydantic's $defs were hoisted: none left anywhere, and no ref points into one.
    assert not any(key == "$defs" for _, key in _walk(doc))
    assert not any("$defs" in ref for ref in refs)


def test_openapi_covers_the_api() -> None:
    doc = build_openapi()
    expected = {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/{job_id}"),
        ("DELETE", "/v1/jobs/{job_id}"),
        ("GET", "/health"),
        ("GET", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/v1/envelope"),
        ("GET", "/openapi.json"),
        # The Files and Batch APIs (gateway/openapi_batch.py).
        ("POST", "/v1/files"),
        ("GET", "/v1/files"),
        ("GET", "/v1/files/{file_id}"),
        ("DELETE", "/v1/files/{file_id}"),
        ("GET", "/v1/files/{file_id}/content"),
        ("POST", "/v1/batches"),
        ("GET", "/v1/batches"),
        ("GET", "/v1/batches/{batch_id}"),
        ("POST", "/v1/batches/{batch_id}/cancel"),
    }
    assert expected == DOCUMENTED_OPERATIONS
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert set(chat["responses"]) == {"200", "400", "401", "403", "404", "408", "413", "429", "503"}
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    too_many = _resolve(doc, chat["responses"]["429"]["$ref"])
    assert "Retry-After" in too_many["headers"]
    schemas = doc["components"]["schemas"]
    for name in ("Error", "ChatCompletionRequest", "JobCreateRequest", "Job", "ChatCompletion"):
        assert name in schemas
    assert schemas["ChatCompletionRequest"]["properties"]["messages"]["items"] == {
        "$ref": "#/components/schemas/ChatMessage"
    }
    assert "custom_id" in schemas["JobCreateRequest"]["properties"]
    job = schemas["Job"]["properties"]
    assert job["status"]["enum"] == [
        "queued",
        "running",
        "completed",
        "failed",
        "cancelled",
        "expired",
    ]
    for field in ("class", "custom_id", "created_at", "deadline_at", "started_at", "finished_at",
                  "attempts", "metadata", "response", "error"):  # fmt: skip
        assert field in job


def test_hoist_defs_rewrites_refs_and_rejects_conflicts() -> None:
    components: dict[str, Any] = {}
    schema = {
        "$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}}, "B": {}},
        "properties": {"a": {"$ref": "#/$defs/A"}},
    }
    hoisted = hoist_defs(schema, components)
    assert hoisted == {"properties": {"a": {"$ref": "#/components/schemas/A"}}}
    assert components["A"]["properties"]["b"] == {"$ref": "#/components/schemas/B"}
    assert "$defs" in schema  # the input is left alone
    with pytest.raises(ValueError):
        hoist_defs({"$defs": {"B": {"type": "string"}}}, components)


# ---- the document says what the validators accept --------------------------------------------


def _body_validator(name: str) -> Any:
    import jsonschema_rs  # schemathesis's validator: the fuzz test judges bodies with it too

    components = build_openapi()["components"]
    return jsonschema_rs.validator_for(
        {"$ref": f"#/components/schemas/{name}", **{"components": components}}
    )


def _accepted(parse: Any, body: dict[str, Any]) -> bool:
    try:
        parse(body)
    except APIError:
        return False
    return True


# Bodies on both sides of each rule the validators enforce: for every one, the document and the
# server must agree (schemathesis's positive_data_acceptance / negative_data_rejection checks).
CHAT_AGREEMENT_CASES: list[dict[str, Any]] = [
    {},
    {"seed": 1329118.0},
    {"seed": 1.5},
    {"seed": -1},
    {"max_tokens": 0},
    {"max_tokens": 5, "max_completion_tokens": 5},
    {"max_tokens": 5, "max_completion_tokens": None},
    {"stream_options": {}},
    {"stream_options": {}, "stream": True},
    {"stream_options": None},
    {"stream": None, "ignore_eos": None},
    {"tools": []},
    {"tools": {}},
    {"tools": [{"type": "function"}]},
    {"tool_choice": "none"},
    {"tool_choice": "auto"},
    {"tool_choice": 0},
    {"n": 1},
    {"n": 2},
    {"top_k": -1},
    {"top_k": 0},
    {"top_k": 40},
    {"presence_penalty": 0.0},
    {"presence_penalty": 0.5},
    {"logprobs": False},
    {"logprobs": True},
    {"metadata": {str(i): "v" for i in range(16)}},
    {"metadata": {str(i): "v" for i in range(17)}},
    {"metadata": {"k" * 65: "v"}},
    {"metadata": {"k": "v" * 513}},
]
JOB_AGREEMENT_CASES: list[dict[str, Any]] = [
    {"completion_window": ""},
    {"completion_window": "24h"},
    {"completion_window": "168h"},
    {"completion_window": "169h"},
    {"completion_window": "604800s"},
    {"completion_window": "604801s"},
    {"completion_window": "10080m"},
    {"completion_window": "10081m"},
    {"completion_window": "0s"},
    {"completion_window": "024h"},
    {"completion_window": "24h\n"},
    {"deadline_s": 60, "completion_window": "1h"},
    {"deadline_s": 60, "completion_window": None},
    {"stream": False},
    {"stream": True},
    {"stream_options": {}},
    {"custom_id": "a-1"},
    {"custom_id": "a b"},
]


@pytest.mark.parametrize("patch", CHAT_AGREEMENT_CASES, ids=str)
def test_document_and_validator_agree_on_chat_bodies(patch: dict[str, Any]) -> None:
    body = {**BASE, **patch}
    assert _body_validator("ChatCompletionRequest").is_valid(body) == _accepted(
        parse_chat_request, body
    )


@pytest.mark.parametrize("patch", CHAT_AGREEMENT_CASES + JOB_AGREEMENT_CASES, ids=str)
def test_document_and_validator_agree_on_job_bodies(patch: dict[str, Any]) -> None:
    body = {**BASE, **patch}
    assert _body_validator("JobCreateRequest").is_valid(body) == _accepted(parse_job_request, body)


@pytest.mark.parametrize(
    "window", ["1s", "24h", "168h", "169h", "0m", "", "10080m", "604800s", "604801s"]
)
def test_document_and_validator_agree_on_batch_windows(window: str) -> None:
    from gateway.batch.schemas import parse_batch_request

    body = {
        "input_file_id": "file-1",
        "endpoint": "/v1/chat/completions",
        "completion_window": window,
    }
    assert _body_validator("BatchCreateRequest").is_valid(body) == _accepted(
        parse_batch_request, body
    )


def test_every_completion_window_the_pattern_takes_is_within_a_week() -> None:
    # The pattern is written digit by digit; check it against the arithmetic at every boundary.
    for unit, unit_s in (("s", 1), ("m", 60), ("h", 3600)):
        for count in range(0, 604_800 // unit_s + 2):
            window = f"{count}{unit}"
            within = 1 <= count * unit_s <= 604_800
            try:
                assert parse_completion_window_s(window) == count * unit_s
                assert within, window
            except schemas_module.ParamError:
                assert not within, window


def test_document_uses_only_json_schema_keywords() -> None:
    # A constraint pydantic cannot translate comes out under its Python name (`ge`, `le`), which
    # JSON Schema ignores: the document would then allow what the server refuses.
    python_names = {"ge", "gt", "le", "lt", "multiple_of", "min_length", "max_length"}
    assert not [path for path, key in _walk(build_openapi()) if key in python_names]
