"""POST /v1/completions and vLLM's request extensions against a real `mixgate serve` (real
redis-server, the official `openai` client and raw httpx), plus GET /health."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.live.processes import ServerProcess
from engine.core.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.core.request import GenerationRequest
from engine.core.sampling_params import SamplingParams
from tests.gateway.test_gateway_e2e import model_name

pytestmark = [pytest.mark.redis, pytest.mark.slow]
PROMPT = "Tell me a story about a lighthouse."


@pytest.fixture
def client(live_server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=live_server.url + "/v1", api_key="unused") as client:
        yield client


def _sse_chunks(
    live_server: ServerProcess, path: str, body: dict[str, Any]
) -> list[dict[str, Any]]:
    with httpx.stream("POST", live_server.url + path, json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        raw = b"".join(response.iter_bytes())
    assert raw.endswith(b"data: [DONE]\n\n")
    frames = raw.split(b"\n\n")[:-2]
    return [json.loads(f[len(b"data: ") :]) for f in frames]


def test_health_is_200_with_an_empty_body(live_server: ServerProcess) -> None:
    response = httpx.get(live_server.url + "/health")
    assert response.status_code == 200
    assert response.content == b""


def test_openai_client_completion_stream_equals_non_stream(client: openai.OpenAI) -> None:
    model = client.models.list().data[0].id
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0)
    assert whole.object == "text_completion"
    assert whole.id.startswith("cmpl-")
    args: dict[str, Any] = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    chunks = list(
        client.completions.create(**args, stream=True, stream_options={"include_usage": True})
    )
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and all(c.usage is None for c in chunks[:-1])
    choices = [choice for chunk in chunks for choice in chunk.choices]
    assert whole.choices[0].text == "".join(choice.text for choice in choices)
    assert whole.choices[0].finish_reason == choices[-1].finish_reason
    assert whole.usage is not None and usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0


def test_token_id_prompt_and_a_list_of_one_give_the_text_prompts_answer(
    live_server: ServerProcess, client: openai.OpenAI
) -> None:
    model = model_name(live_server)
    args: dict[str, Any] = {"max_tokens": 8, "temperature": 0, "ignore_eos": True}
    text = client.completions.create(model=model, prompt=PROMPT, extra_body=args)
    ids = list(PROMPT.encode())  # the tiny model's byte-level tokenizer adds no BOS
    as_ids = client.completions.create(model=model, prompt=ids, extra_body=args)
    as_list = client.completions.create(model=model, prompt=[PROMPT], extra_body=args)
    as_id_list = client.completions.create(model=model, prompt=[ids], extra_body=args)
    texts = {r.choices[0].text for r in (text, as_ids, as_list, as_id_list)}
    assert len(texts) == 1
    assert text.usage is not None and text.usage.prompt_tokens == len(ids)
    assert text.usage.completion_tokens == 8


def _error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_refusals_name_the_field(live_server: ServerProcess) -> None:
    model = model_name(live_server)
    url = live_server.url + "/v1/completions"
    two = httpx.post(url, json={"model": model, "prompt": ["a", "b"]})
    assert _error(two)["param"] == "prompt"
    echo = httpx.post(url, json={"model": model, "prompt": "a", "echo": True})
    assert _error(echo)["param"] == "echo"
    vllm_only = httpx.post(url, json={"model": model, "prompt": "a", "use_beam_search": True})
    error = _error(vllm_only)
    assert error["param"] == "use_beam_search"
    assert error["code"] == "unsupported_parameter"
    assert "vLLM extension" in error["message"]
    both = httpx.post(url, json={"model": model, "prompt": "a", "min_tokens": 2, "stop": "x"})
    assert _error(both)["param"] == "min_tokens"
    too_many = httpx.post(
        url, json={"model": model, "prompt": "a", "max_tokens": 2, "min_tokens": 3}
    )
    assert "min_tokens" in _error(too_many)["message"]
    out_of_vocab = httpx.post(url, json={"model": model, "prompt": [10**6], "max_tokens": 2})
    assert _error(out_of_vocab)["param"] == "prompt"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_guidellm_and_vllm_bench_bodies_give_the_asked_output_and_usage_in_every_chunk(
    live_server: ServerProcess, path: str
) -> None:
    """The bodies guidellm 0.8.1 and vllm bench serve 0.32 send (their extensions included)."""
    body: dict[str, Any] = {
        "model": model_name(live_server),
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "stop": None,
        "ignore_eos": True,
        "repetition_penalty": 1.0,
    }
    if path == "/v1/completions":
        body |= {"prompt": PROMPT, "max_tokens": 12, "logprobs": None}
    else:
        body |= {"messages": [{"role": "user", "content": PROMPT}], "max_completion_tokens": 12}
    chunks = _sse_chunks(live_server, path, body)
    *streamed, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 12
    counts = [c["usage"]["completion_tokens"] for c in streamed]
    assert counts == sorted(counts) and counts[-1] == 12
    assert all(c["usage"]["prompt_tokens"] == last["usage"]["prompt_tokens"] for c in streamed)
    assert streamed[-1]["choices"][0]["finish_reason"] == "length"


def test_vllm_sampling_extensions_are_honoured(live_server: ServerProcess) -> None:
    model = model_name(live_server)
    url = live_server.url + "/v1/completions"
    base = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    plain = httpx.post(url, json={**base, "ignore_eos": True}).json()
    penalized = httpx.post(url, json={**base, "ignore_eos": True, "repetition_penalty": 2.0})
    assert penalized.status_code == 200, penalized.text
    assert penalized.json()["choices"][0]["text"] != plain["choices"][0]["text"]
    # min_p = 1 keeps only the most likely token: sampling at T=1 becomes greedy.
    sampled = {**base, "temperature": 1.0, "min_p": 1.0, "ignore_eos": True, "top_k": 50}
    assert httpx.post(url, json=sampled).json()["choices"][0]["text"] == plain["choices"][0]["text"]


def test_min_tokens_holds_back_a_stop_token_id(
    live_server: ServerProcess, tiny_model_dir: Path
) -> None:
    ids = list(PROMPT.encode())
    # The first greedy token, from the same weights in this process.
    engine = LLMEngine(tiny_model_dir, EngineConfig(device="cpu", num_kv_blocks=16, num_threads=1))
    engine.add_request(
        GenerationRequest("first", tuple(ids), SamplingParams(temperature=0.0, max_tokens=1))
    )
    first = next(o.new_token_ids[0] for o in engine.step())
    url = live_server.url + "/v1/completions"
    base = {"model": model_name(live_server), "prompt": ids, "max_tokens": 12, "temperature": 0}
    stopped = httpx.post(url, json={**base, "stop_token_ids": [first]}).json()
    assert stopped["usage"]["completion_tokens"] == 1
    assert stopped["choices"][0]["finish_reason"] == "stop"
    held = httpx.post(url, json={**base, "stop_token_ids": [first], "min_tokens": 5}).json()
    assert held["usage"]["completion_tokens"] >= 5
