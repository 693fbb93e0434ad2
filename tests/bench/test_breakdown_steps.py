"""The steps behind a slow chat (bench/gateway/breakdown_steps.py): which steps a chat waited on,
and a step trace that reads the server's window in pieces and counts what it missed. Pure, and
a stand-in HTTP transport serving GET /v1/engine/steps' documented shape (the real route is
read end to end by tests/bench/test_latency_breakdown.py and tests/gateway/test_chat_timings.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bench.gateway.breakdown_steps import (
    StepTrace,
    TracedStep,
    attach_steps,
    describe_tokens,
    steps_behind,
)


def _step(index: int, started_s: float, duration_s: float, **tokens: dict[str, int]) -> TracedStep:
    return TracedStep(index, started_s, duration_s, tokens)


def test_a_chat_waits_on_the_step_in_flight_and_those_up_to_its_first_token() -> None:
    steps = [
        _step(0, 0.000, 0.004, bulk={"decode": 3}),  # over before the hand-off
        _step(1, 0.004, 0.012, bulk={"prefill": 128, "decode": 3}),  # in flight
        _step(2, 0.016, 0.010, bulk={"prefill": 128}),  # the chat sat it out
        _step(3, 0.026, 0.013, interactive={"prefill": 200}, bulk={"decode": 3}),  # its own
        _step(4, 0.039, 0.004, interactive={"decode": 1}),  # after its first token
    ]
    handed_at_s, first_token_at_s = 0.010, 0.0395
    behind = steps_behind(handed_at_s, first_token_at_s, reversed(steps))
    assert [s["step_index"] for s in behind] == [1, 2, 3]
    assert [s["in_flight"] for s in behind] == [True, False, False]
    assert behind[0]["offset_s"] == pytest.approx(-0.006)
    assert behind[2]["tokens"] == {"interactive": {"prefill": 200}, "bulk": {"decode": 3}}


def test_the_step_that_ends_at_the_first_token_is_the_chats_own() -> None:
    # The native engine notes a first token at its step's own end: the same instant, up to
    # float rounding either way.
    own = _step(7, 1.0, 0.01, interactive={"prefill": 50})
    assert [s["step_index"] for s in steps_behind(0.995, own.ended_s - 1e-9, [own])] == [7]
    # A step that ended exactly at the hand-off was over before the chat reached the engine.
    assert steps_behind(own.ended_s, own.ended_s + 0.5, [own]) == []


def test_tokens_are_described_per_class_and_kind() -> None:
    tokens = {"bulk": {"prefill": 128, "decode": 12}, "interactive": {"decode": 3}}
    assert describe_tokens(tokens) == "chat 3d, bulk 128p+12d"
    assert describe_tokens({}) == "-"


def test_a_chat_without_both_instants_gets_no_steps() -> None:
    rows: list[dict[str, Any]] = [
        {"handed_at_s": 0.010, "first_token_at_s": 0.020},
        {"handed_at_s": None, "first_token_at_s": 0.020},
    ]
    attach_steps(rows, [_step(0, 0.012, 0.005, interactive={"prefill": 9})])
    assert [s["step_index"] for s in rows[0]["steps"]] == [0]
    assert rows[1]["steps"] is None


class _StepWindow:
    """GET /v1/engine/steps over a window of the last `keep` steps numbered from `first` up to
    `count` (the server's shape; it keeps none numbered before `first`)."""

    def __init__(self, keep: int, first: int = 0):
        self.keep = keep
        self.first = first
        self.count = first

    def grow(self, to: int) -> None:
        self.count = to

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/engine/steps"
        after = int(request.url.params.get("after_step", "-1"))
        window = range(max(self.first, self.count - self.keep), self.count)
        data = [
            {
                "step_index": i,
                "started_s": i / 100,
                "duration_s": 0.005,
                "tokens": {"bulk": {"decode": 1}},
                "running": {"bulk": 1},
                "waiting": {},
            }
            for i in window
            if i > after
        ]
        first = window[0] if window else None
        last = window[-1] if window else None
        body = {"object": "list", "clock": "monotonic", "data": data}
        return httpx.Response(200, json={**body, "first_step": first, "last_step": last})


def test_the_trace_keeps_the_runs_steps_once_and_counts_those_it_missed() -> None:
    window = _StepWindow(keep=6)
    window.grow(10)  # steps before the run: not the run's
    # A read interval longer than the test: only start()'s and stop()'s reads happen.
    trace = StepTrace("http://mixgate", interval_s=3600, transport=httpx.MockTransport(window))
    trace.start()
    window.grow(20)  # steps 10..19; the window now holds 14..19
    steps = trace.stop()
    assert [s.step_index for s in steps] == [14, 15, 16, 17, 18, 19]
    assert trace.missed == 4
    assert steps[0] == TracedStep(14, 0.14, 0.005, {"bulk": {"decode": 1}})


def test_a_trace_that_starts_on_an_empty_window_takes_the_first_steps_it_sees() -> None:
    # The engine numbered its warm-up steps (0..8) before the gateway kept any: step 9 is the
    # run's first, not a sign of nine missed.
    window = _StepWindow(keep=6, first=9)
    trace = StepTrace("http://mixgate", interval_s=3600, transport=httpx.MockTransport(window))
    trace.start()
    window.grow(13)
    assert [s.step_index for s in trace.stop()] == [9, 10, 11, 12]
    assert trace.missed == 0
