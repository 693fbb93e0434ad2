"""Hostile input and access against a real `mixgate serve` (with API keys) on loopback: every
refusal is an OpenAI-shaped error with the right status, the server keeps serving, and no key
ever reaches its logs."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.live.processes import ServerProcess
from tests.replica_cluster import cluster_prefix

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ALPHA, BETA, LIMITED = "sk-alpha-3f9c2e", "sk-beta-77ab01", "sk-limited-5d5d5d"
WRONG = "sk-wrong-0c0ffee"
MAX_BODY_BYTES = 256 * 1024
BODY_READ_TIMEOUT_S = 1.0
KEYS = {
    "keys": [
        {"key": ALPHA, "tenant": "alpha", "classes": ["interactive", "bulk"]},
        {"key": BETA, "tenant": "beta", "classes": ["bulk"]},
        {"key": LIMITED, "tenant": "gamma", "rate_limit_per_s": 1},
    ]
}


@pytest.fixture(scope="module")
def server(
    tiny_model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = {
        "MIXGATE_MAX_BODY_BYTES": str(MAX_BODY_BYTES),
        "MIXGATE_BODY_READ_TIMEOUT_S": str(BODY_READ_TIMEOUT_S),
    }
    tmp = tmp_path_factory.mktemp("hostile")
    proc = ServerProcess(
        tiny_model_dir,
        redis_server,
        cluster_prefix(),
        tmp,
        api_keys_json=json.dumps(KEYS),
        extra_env=env,
    ).start()
    yield proc
    assert proc.stop() == 0, proc.logs()
    logs = proc.log_path.read_text() if proc.log_path else ""
    assert logs and not any(key in logs for key in (ALPHA, BETA, LIMITED, WRONG))


@pytest.fixture(scope="module")
def alpha(server: ServerProcess) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {ALPHA}"}
    with httpx.Client(base_url=server.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def model(alpha: httpx.Client) -> str:
    return str(alpha.get("/v1/models").json()["data"][0]["id"])


def chat(model: str, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code", "param"}
    error: dict[str, Any] = body["error"]
    return error


def test_body_over_the_limit_is_413_with_or_without_content_length(
    alpha: httpx.Client, model: str
) -> None:
    big = json.dumps(chat(model, "x" * MAX_BODY_BYTES)).encode()
    error_of(alpha.post("/v1/chat/completions", content=big), 413)

    def chunks() -> Iterator[bytes]:  # chunked: no Content-Length to refuse it by
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    error_of(alpha.post("/v1/jobs", content=chunks()), 413)


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"[" * 10_000 + b"]" * 10_000, "invalid_json"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}', "invalid_json"),
        (b'{"model": "m", "max_tokens": NaN}', "invalid_json"),
    ],
    ids=["deep-json", "invalid-utf8", "nan"],
)
def test_malformed_bodies_are_400(alpha: httpx.Client, raw: bytes, code: str) -> None:
    headers = {"content-type": "application/json"}
    for path in ("/v1/chat/completions", "/v1/jobs"):
        assert error_of(alpha.post(path, content=raw, headers=headers), 400)["code"] == code


def test_control_characters_in_content_are_served(alpha: httpx.Client, model: str) -> None:
    # NOTE: decided: control characters are text like any other (the byte-level tokenizer
    # encodes them); refusing them would break clients that send terminal output or logs.
    text = "bell\x07 nul\x00 esc\x1b[31m del\x7f cr\r lf\n tab\t"
    response = alpha.post("/v1/chat/completions", json=chat(model, text, max_tokens=4))
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] > len(text)


@pytest.mark.parametrize("max_tokens", [10**12, 2**31 - 1, 100_000])
def test_huge_max_tokens_is_refused_naming_the_param(
    alpha: httpx.Client, model: str, max_tokens: int
) -> None:
    response = alpha.post("/v1/chat/completions", json=chat(model, max_tokens=max_tokens))
    assert response.status_code in (400, 413), response.text
    assert error_of(response, response.status_code)["param"] == "max_tokens"


def test_stop_list_of_10k_items_is_400(alpha: httpx.Client, model: str) -> None:
    body = chat(model, stop=[f"s{i}" for i in range(10_000)])
    assert error_of(alpha.post("/v1/chat/completions", json=body), 400)["param"] == "stop"
    long_stop = chat(model, stop=["x" * 10_000])
    param = error_of(alpha.post("/v1/chat/completions", json=long_stop), 400)["param"]
    assert param.startswith("stop")


def test_header_injection_in_custom_id_goes_nowhere(alpha: httpx.Client, model: str) -> None:
    for custom_id in ("a\r\nX-Evil: 1", "a\nX-Evil: 1", "a\x00b", "x" * 65):
        response = alpha.post("/v1/jobs", json={**chat(model), "custom_id": custom_id})
        assert error_of(response, 400)["param"] == "custom_id"
        assert "x-evil" not in response.headers
    ok = alpha.post("/v1/jobs", json={**chat(model, max_tokens=2), "custom_id": "doc-1.a:b_c"})
    assert ok.status_code == 202 and "x-evil" not in ok.headers
    assert ok.headers["location"] == f"/v1/jobs/{ok.json()['id']}"


def test_slow_loris_body_times_out_and_others_are_served(server: ServerProcess, model: str) -> None:
    body = json.dumps(chat(model)).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {ALPHA}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall(head)
        reply = b""
        sent = 0
        # A byte every 0.2 s: the whole body would take many times the read timeout.
        for byte in body:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # the server hung up on us: fine too
            sent += 1
            # Meanwhile the server serves everyone else.
            assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
            sock.settimeout(0.2)
            try:
                reply += sock.recv(65536)
            except TimeoutError:
                continue
            if reply:
                break
        # The server gave up on the body before it was whole (the verdict is that, not a
        # wall-time bound: the loop itself is bounded by the body's length).
        assert sent < len(body), "the whole body went through without a timeout"
        # The headers and the body may arrive in separate segments: read the whole response.
        reply = _read_whole_response(sock, reply)
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b'"code":"request_timeout"' in reply


def _read_whole_response(sock: socket.socket, reply: bytes) -> bytes:
    """Keep reading until the Content-Length of body bytes is in (or the server closes)."""
    sock.settimeout(5)
    while True:
        head, sep, rest = reply.partition(b"\r\n\r\n")
        if sep:
            lengths = [
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ]
            if lengths and len(rest) >= lengths[0]:
                return reply
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, OSError):
            return reply
        if not chunk:
            return reply
        reply += chunk


def test_auth_statuses(server: ServerProcess, model: str, alpha: httpx.Client) -> None:
    url = server.url

    def as_key(key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=url, headers=headers, timeout=30)

    with as_key(None) as anon, as_key(WRONG) as wrong, as_key(BETA) as beta:
        assert error_of(anon.post("/v1/chat/completions", json=chat(model)), 401)
        assert error_of(wrong.get("/v1/jobs"), 401)["type"] == "authentication_error"
        forbidden = error_of(beta.post("/v1/chat/completions", json=chat(model)), 403)
        assert forbidden["code"] == "class_not_allowed"
        job = beta.post("/v1/jobs", json=chat(model, max_tokens=2))
        assert job.status_code == 202
        job_id = job.json()["id"]
        assert error_of(alpha.get(f"/v1/jobs/{job_id}"), 404)["code"] == "job_not_found"
        assert error_of(alpha.delete(f"/v1/jobs/{job_id}"), 404)
        assert job_id not in [j["id"] for j in alpha.get("/v1/jobs").json()["data"]]
    with as_key(LIMITED) as limited:
        statuses = [limited.get("/v1/jobs").status_code for _ in range(5)]
        assert statuses[0] == 200 and 429 in statuses, statuses
        refused = limited.get("/v1/jobs")
        assert error_of(refused, 429)["type"] == "rate_limit_error"
        assert int(refused.headers["retry-after"]) >= 1
