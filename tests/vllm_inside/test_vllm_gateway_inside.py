"""`mixgate serve --engine vllm` end to end: real redis-server, real HTTP, real vLLM on CPU.

Runs inside the vLLM environment (tests/engine/test_vllm_backend.py starts it), so `ServerProcess`
starts the servers with that environment's python. A native server on the same folder is the
reference for greedy outputs.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.dependencies import require_module

require_module("vllm", "run with the vLLM environment's python (.venv-vllm)")

from bench.live.processes import ServerProcess  # noqa: E402
from engine.model.make_model import make_model  # noqa: E402
from policies.envelope import Envelope, dump_envelope  # noqa: E402
from tests.gateway.test_gateway_e2e import chat_body, kv_state, model_name, wait_jobs  # noqa: E402

pytestmark = [
    pytest.mark.redis,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
    pytest.mark.timeout(500),
]
PROMPTS = ["Hello there", "Write a haiku about queues.", "x" * 300]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # `small`, not `tiny`: vLLM's CPU attention needs a head size of at least 32.
    return make_model(tmp_path_factory.mktemp("gw-model") / "small", "small", seed=3)


def _server(model_dir: Path, redis_url: str, tmp: Path, engine: str) -> ServerProcess:
    prefix = f"{{mg-{uuid.uuid4().hex[:8]}}}:"
    # These tests are about outputs, not admission: no TTFT deadline to miss on a busy box.
    envelope = dataclasses.replace(Envelope.default(), interactive_ttft_target_s=3600.0)
    envelope_path = tmp / f"{engine}-envelope.toml"
    envelope_path.write_text(dump_envelope(envelope))
    return ServerProcess(
        model_dir,
        redis_url,
        prefix,
        tmp / engine,
        envelope_path=envelope_path,
        extra_env={
            "MIXGATE_ENGINE": engine,
            "MIXGATE_NUM_THREADS": "2",
            "MIXGATE_KV_CACHE_BYTES": str(32 << 20),
        },
    )


@pytest.fixture(scope="module")
def servers(
    model_dir: Path, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    tmp = tmp_path_factory.mktemp("gw")
    vllm = _server(model_dir, redis_server, tmp, "vllm").start(ready_timeout_s=450)
    native = _server(model_dir, redis_server, tmp, "native").start()
    yield vllm, native
    assert native.stop() == 0, native.logs()
    assert vllm.stop() == 0, vllm.logs()


def _chat(server: ServerProcess, content: str, **extra: object) -> str:
    body = chat_body(model_name(server), content, max_tokens=16, temperature=0, **extra)
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_greedy_chat_equals_the_native_engines(servers: tuple[ServerProcess, ...]) -> None:
    vllm, native = servers
    for prompt in PROMPTS:
        assert _chat(vllm, prompt, ignore_eos=True) == _chat(native, prompt, ignore_eos=True)
    # A stop string is cut the same way (the detokenizer is shared, not vLLM's).
    reference = _chat(native, PROMPTS[0], ignore_eos=True)
    stop = reference[3:5]
    if stop.strip("\ufffd"):
        assert _chat(vllm, PROMPTS[0], ignore_eos=True, stop=[stop]) == _chat(
            native, PROMPTS[0], ignore_eos=True, stop=[stop]
        )


def test_disconnect_and_job_delete_free_the_request_in_vllm(
    servers: tuple[ServerProcess, ...],
) -> None:
    vllm, _ = servers
    model = model_name(vllm)
    body = chat_body(model, max_tokens=600, temperature=0, stream=True, ignore_eos=True)
    with httpx.stream("POST", vllm.url + "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()  # not a for-break: that would close the response
        frames = [next(lines) for _ in range(6)]
        assert frames[0].startswith("data: ")
        assert kv_state(vllm)[1] >= 1  # running while the client holds the stream
        response.close()
    with httpx.Client(base_url=vllm.url, timeout=30) as client:
        long = {**chat_body(model, max_tokens=600, temperature=0), "ignore_eos": True}
        job = client.post("/v1/jobs", json=long).json()["id"]
        deadline = time.monotonic() + 60
        while client.get(f"/v1/jobs/{job}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.delete(f"/v1/jobs/{job}").status_code == 200
        assert wait_jobs(client, [job], 30)[job]["status"] == "cancelled"
    # One more request runs to its end; vLLM's KV usage (its own block pool) is then back to
    # zero and nothing runs: the cancelled requests left vLLM.
    assert _chat(vllm, "after", ignore_eos=True)
    deadline = time.monotonic() + 30  # a bound for a hang, not a speed
    while time.monotonic() < deadline and kv_state(vllm) != (0.0, 0.0):
        time.sleep(0.05)
    assert kv_state(vllm) == (0.0, 0.0)
