"""The job payload survives its trip through Redis exactly."""

from __future__ import annotations

import json

from engine.core.sampling_params import SamplingParams
from gateway.queue.payload import JobPayload


def test_payload_round_trips_through_json() -> None:
    sampling = SamplingParams(
        max_tokens=64, temperature=0.7, top_p=0.9, seed=3, stop=("\n\n", "END"), stop_token_ids=(7,)
    )
    payload = JobPayload(
        prompt_token_ids=tuple(range(1000)),
        sampling=sampling,
        model="tiny",
        created_s=1_700_000_000,
        stream=True,
        include_usage=True,
        extra={"user": "u-1"},
    )
    text = payload.to_json()
    assert JobPayload.from_json(text) == payload
    raw = json.loads(text)
    assert raw["prompt_token_ids"][:3] == [0, 1, 2] and raw["sampling"]["stop"] == ["\n\n", "END"]
    assert "max_stop_strings" not in raw["sampling"]
