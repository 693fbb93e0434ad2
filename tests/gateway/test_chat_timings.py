"""The server's own timings of a streamed chat (`x-mixgate-timings: 1`), through a real
`mixgate serve`: the parts `mixgate bench breakdown` splits each chat's TTFT into."""

from __future__ import annotations

import json
import time
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
