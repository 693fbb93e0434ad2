"""The engine steps behind each slow chat, for `mixgate bench breakdown`.

The TTFT split says how long a chat waited in each part; it cannot say on what. The server lists
its engine's recent steps with when each started (GET /v1/engine/steps) and a chat's timings
carry when it was handed to the engine and when its first token was sampled, on the same
clock. `StepTrace` reads the steps while the load runs (the server keeps a window of them, so
a run of thousands of steps is read in pieces); `steps_behind` lays one chat against them:
the step in flight when it was handed (what `accept` waited out), any steps it sat out, and
the step that sampled its first token.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import httpx

__all__ = [
    "READ_INTERVAL_S",
    "StepTrace",
    "TracedStep",
    "attach_steps",
    "describe_tokens",
    "steps_behind",
]

# How often the trace reads the server's step window. The window holds 4,096 steps
# (gateway.http.metrics), ~8 s of the shortest steps seen here (2 ms), so a second between
# reads leaves a wide margin; a read that finds a gap counts the steps it missed.
READ_INTERVAL_S: Final = 1.0
# A first token is noted when its step's output is read, which is after the step ended (the
# native engine notes the step's own end: equal up to float rounding).
_END_SLACK_S: Final = 1e-4
# Class names as a slow-chat row prints them.
_SHORT_CLASS: Final = {"interactive": "chat", "bulk": "bulk"}


@dataclass(frozen=True, slots=True)
class TracedStep:
    step_index: int
    started_s: float
    duration_s: float
    # class -> kind -> tokens, as GET /v1/engine/steps lists them
    tokens: dict[str, dict[str, int]]

    @property
    def ended_s(self) -> float:
        return self.started_s + self.duration_s

    @classmethod
    def from_json(cls, step: Mapping[str, Any]) -> TracedStep:
        return cls(
            step_index=int(step["step_index"]),
            started_s=float(step["started_s"]),
            duration_s=float(step["duration_s"]),
            tokens={c: dict(kinds) for c, kinds in step.get("tokens", {}).items()},
        )


def describe_tokens(tokens: Mapping[str, Mapping[str, int]]) -> str:
    """e.g. ``bulk 128p+12d, chat 339p+3d`` (p: prefill tokens, d: decode tokens)."""
    parts = []
    for request_class in ("interactive", "bulk"):
        kinds = tokens.get(request_class, {})
        prefill, decode = kinds.get("prefill", 0), kinds.get("decode", 0)
        if prefill or decode:
            shown = "+".join(f"{n}{k}" for n, k in ((prefill, "p"), (decode, "d")) if n)
            parts.append(f"{_SHORT_CLASS[request_class]} {shown}")
    return ", ".join(parts) or "-"


def steps_behind(
    handed_at_s: float, first_token_at_s: float, steps: Iterable[TracedStep]
) -> list[dict[str, Any]]:
    """The steps that ended while the chat waited for its first token (after it was handed to
    the engine, by its first token), oldest first. ``in_flight``: it had started before the
    chat was handed, so the chat could not be in it. ``offset_s``: its start, from the hand-off.

    NOTE: the last one is the step that sampled the first token unless a later step also ended
    before that token was read (the event loop late by more than a step): the offsets show it.
    """
    behind = [s for s in steps if handed_at_s < s.ended_s <= first_token_at_s + _END_SLACK_S]
    behind.sort(key=lambda s: s.started_s)
    return [
        {
            "step_index": s.step_index,
            "offset_s": s.started_s - handed_at_s,
            "duration_s": s.duration_s,
            "in_flight": s.started_s < handed_at_s,
            "tokens": s.tokens,
        }
        for s in behind
    ]


def attach_steps(slowest: Sequence[dict[str, Any]], steps: Sequence[TracedStep]) -> None:
    """Give each slow-chat row of the breakdown its ``steps`` (None where the chat's timings
    lack the two instants, e.g. an engine that does not say when it took a request)."""
    for chat in slowest:
        handed, first = chat.get("handed_at_s"), chat.get("first_token_at_s")
        chat["steps"] = (
            None if handed is None or first is None else steps_behind(handed, first, steps)
        )


class StepTrace:
    """Reads GET /v1/engine/steps every `interval_s` on a thread of its own, from `start()` to
    `stop()`, keeping every step once; `missed` counts steps that left the server's window
    between two reads."""

    def __init__(
        self,
        base_url: str,
        interval_s: float = READ_INTERVAL_S,
        transport: httpx.BaseTransport | None = None,
    ):
        self._client = httpx.Client(base_url=base_url, timeout=10, transport=transport)
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-trace", daemon=True)
        self._last_index: int | None = None
        self.steps: list[TracedStep] = []
        self.missed = 0

    def start(self) -> StepTrace:
        # The first read only notes where the window ends: the run's steps are those after it.
        page = self._read()
        # None: the window was empty, so the run's first step is whichever comes first (the
        # engine numbered its warm-up steps before the gateway kept any).
        self._last_index = page["last_step"]
        self._thread.start()
        return self

    def stop(self) -> list[TracedStep]:
        self._stopped.set()
        self._thread.join()
        self._read_more()
        self._client.close()
        return self.steps

    def _read(self, after_step: int | None = None) -> dict[str, Any]:
        params = {} if after_step is None else {"after_step": after_step}
        response = self._client.get("/v1/engine/steps", params=params)
        response.raise_for_status()
        page: dict[str, Any] = response.json()
        return page

    def _take(self, page: Mapping[str, Any]) -> None:
        first, last = page.get("first_step"), self._last_index
        if first is not None and last is not None and first > last + 1:
            self.missed += first - last - 1
        for step in page["data"]:
            traced = TracedStep.from_json(step)
            if self._last_index is None or traced.step_index > self._last_index:
                self.steps.append(traced)
                self._last_index = traced.step_index

    def _read_more(self) -> None:
        # A failed read: the next one asks again from the same step, and steps that left the
        # window meanwhile are counted in `missed` (a server gone at the end of a failed run
        # must not hide why it failed).
        with contextlib.suppress(httpx.HTTPError):
            self._take(self._read(self._last_index))

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._read_more()
