"""The server's own timings of a streamed chat (`x-mixgate-timings: 1`), through a real
`mixgate serve`: the parts `mixgate bench breakdown` splits each chat's TTFT into."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

from bench.live.processes import ServerProcess
from tests.gateway.test_gateway_e2e import chat_body, model_name, server

pytestmark = [pytest.mark.redis, pytest.mark.slow]
__all__ = ["server"]  # the module's real server (a fixture)


def test_timings_split_a_chats_wait_into_parts_that_add_up(server: ServerProcess) -> None:
    # x-mixgate-timings: 1 puts the server's timings on the finishing chunk (load generators
    # read them, `mixgate bench breakdown` splits each chat's TTFT with them).
    body = chat_body(model_name(server), max_tokens=8, temperature=0, stream=True)
    headers = {"x-mixgate-timings": "1"}
    sent_s = time.monotonic()
    first_content_s = None
    timings: dict[str, Any] = {}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers=headers
    ) as response:
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            if delta.get("content") and first_content_s is None:
                first_content_s = time.monotonic()
            timings = chunk.get("mixgate_timings") or timings
    assert first_content_s is not None
    parts = ("dispatch_s", "accept_s", "intake_s", "delivery_s")
    assert all(timings[part] >= 0 for part in parts), timings
    # Admission -> handed to the engine -> taken in: both inside the queue delay.
    assert timings["dispatch_s"] + timings["accept_s"] <= timings["queue_s"]
    # Handler start -> admitted -> first text sampled -> its chunk written: inside what the
    # client waited for its first content (admission's time is kept in whole ms).
    handler_to_write_s = timings["intake_s"] + timings["text_ttft_s"] + timings["delivery_s"]
    assert handler_to_write_s <= first_content_s - sent_s + 0.002


def test_a_chats_timings_place_it_among_the_engines_steps(server: ServerProcess) -> None:
    # GET /v1/engine/steps lists the steps on the clock of the chat's handed_at_s and
    # first_token_at_s: the steps that ended between the two ran the chat's whole prompt but
    # what the prefix cache held (it is alone on the server).
    steps_url = server.url + "/v1/engine/steps"
    before = httpx.get(steps_url).json()
    assert before["object"] == "list" and before["clock"] == "monotonic"
    body = chat_body(
        model_name(server),
        content=f"where do the steps go {uuid.uuid4().hex}",
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    timings: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, headers={"x-mixgate-timings": "1"}
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: ") :])
                timings = chunk.get("mixgate_timings") or timings
                usage = chunk.get("usage") or usage
    after = -1 if before["last_step"] is None else before["last_step"]
    page = httpx.get(steps_url, params={"after_step": after}).json()
    assert page["data"] and all(step["step_index"] > after for step in page["data"])
    handed_s, first_token_s = timings["handed_at_s"], timings["first_token_at_s"]
    assert handed_s < first_token_s
    behind = [
        step
        for step in page["data"]
        if handed_s < step["started_s"] + step["duration_s"] <= first_token_s + 1e-4
    ]
    prefill = sum(s["tokens"].get("interactive", {}).get("prefill", 0) for s in behind)
    assert prefill == usage["prompt_tokens"] - timings["cached_prompt_tokens"] > 0
    # Nothing after the last step read.
    assert httpx.get(steps_url, params={"after_step": page["last_step"]}).json()["data"] == []


@pytest.mark.parametrize("after_step", ["soon", "-2", "1.5"])
def test_a_bad_after_step_is_refused_in_openais_shape(
    server: ServerProcess, after_step: str
) -> None:
    response = httpx.get(server.url + "/v1/engine/steps", params={"after_step": after_step})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "after_step"
