"""The OpenAPI document: well formed, covering the API, and saying what the validators accept."""

from __future__ import annotations

import json
from typing import Any

import pytest

import gateway.http.schemas as schemas_module
from gateway.http.errors import APIError
from gateway.http.openapi import DOCUMENTED_OPERATIONS, build_openapi, hoist_defs
from gateway.http.schemas import (
    parse_chat_request,
    parse_completion_window_s,
    parse_job_request,
)
from tests.gateway.test_gateway_schemas import BASE

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
        ("GET", "/v1/chat/completions/{completion_id}/stream"),
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
        ("GET", "/v1/engine/steps"),
        ("GET", "/openapi.json"),
        # The Files and Batch APIs (gateway/http/openapi_batch.py).
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
