"""What `mixgate bench breakdown` reads from the server: each request's predicted TTFT
(``x-mixgate-predicted-ttft-ms``) and each chat's server-side TTFT, noted on the request's own
record by `BreakdownSender`, and the server counters (/metrics, Redis ``INFO commandstats``)
before and after the run."""

from __future__ import annotations

import contextvars
import random
from dataclasses import dataclass, field
from typing import Any

import redis
from prometheus_client.parser import text_string_to_metric_families

from bench.load.client import LoadClient, LoadResponse, LoadStream
from bench.load.http_clients import HttpSender, _Stream
from bench.load.records import RequestRecord
from bench.load.workload import PlannedRequest

__all__ = [
    "PREDICTED_TTFT_HEADER",
    "BreakdownSender",
    "ServerCounters",
    "parse_server_metrics",
    "redis_commandstats",
]

PREDICTED_TTFT_HEADER = "x-mixgate-predicted-ttft-ms"
# The record of the job submission under way (each request runs in its own task).
_current_record: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar(
    "breakdown_record", default=None
)


def _predicted_s(response: LoadResponse | LoadStream) -> float | None:
    raw = response.headers.get(PREDICTED_TTFT_HEADER)
    try:
        return float(raw) / 1000 if raw is not None else None
    except ValueError:
        return None


class _PostTap:
    """The sender's client, with every job submission's predicted TTFT noted on its record."""

    def __init__(self, client: LoadClient):
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def post(self, url: str, **kwargs: Any) -> LoadResponse:
        response = await self._client.post(url, **kwargs)
        record = _current_record.get()
        if record is not None:
            record.predicted_ttft_s = _predicted_s(response)
        return response


class BreakdownSender(HttpSender):
    """mixgate's sender, also noting on each record admission's prediction and, for a chat,
    the server's own TTFT. The records carry them, so the chats can be sent from their own
    process (`run_load(chat_process=True)`) like every other benchmark's."""

    def __init__(self, client: LoadClient, *args: Any, **kwargs: Any) -> None:
        super().__init__(client, *args, **kwargs)
        self._client = _PostTap(client)  # type: ignore[assignment]

    async def _bulk(
        self,
        request: PlannedRequest,
        record: RequestRecord,
        body: dict[str, Any],
        rng: random.Random,
    ) -> None:
        _current_record.set(record)
        await super()._bulk(request, record, body, rng)

    async def _read_stream(
        self, response: LoadStream, record: RequestRecord, state: _Stream
    ) -> None:
        record.predicted_ttft_s = _predicted_s(response)
        await super()._read_stream(response, record, state)

    def _on_chunk(self, chunk: dict[str, Any], record: RequestRecord, state: _Stream) -> bool:
        timings = chunk.get("mixgate_timings")
        if isinstance(timings, dict) and isinstance(timings.get("ttft_s"), int | float):
            record.server_ttft_s = float(timings["ttft_s"])
            text_ttft_s = timings.get("text_ttft_s")
            if isinstance(text_ttft_s, int | float):
                record.server_text_ttft_s = float(text_ttft_s)
            record.server_intake_s = timings.get("intake_s")
            record.server_delivery_s = timings.get("delivery_s")
        return super()._on_chunk(chunk, record, state)


@dataclass
class ServerCounters:
    """The counters the breakdown takes deltas of (a /metrics scrape + INFO commandstats)."""

    loop_lag_sum_s: float = 0.0
    loop_lag_count: int = 0
    engine_steps: int = 0
    engine_step_s: float = 0.0
    engine_steps_unseen: int = 0
    tokens: dict[tuple[str, str], float] = field(default_factory=dict)
    class_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    redis_by_command: dict[str, tuple[int, float]] = field(default_factory=dict)

    def minus(self, before: ServerCounters) -> ServerCounters:
        keys = set(self.tokens) | set(before.tokens)
        commands = set(self.redis_by_command) | set(before.redis_by_command)

        def command_delta(name: str) -> tuple[int, float]:
            calls, usec = self.redis_by_command.get(name, (0, 0.0))
            calls0, usec0 = before.redis_by_command.get(name, (0, 0.0))
            return calls - calls0, usec - usec0

        return ServerCounters(
            loop_lag_sum_s=self.loop_lag_sum_s - before.loop_lag_sum_s,
            loop_lag_count=self.loop_lag_count - before.loop_lag_count,
            engine_steps=self.engine_steps - before.engine_steps,
            engine_step_s=self.engine_step_s - before.engine_step_s,
            engine_steps_unseen=self.engine_steps_unseen - before.engine_steps_unseen,
            tokens={k: self.tokens.get(k, 0.0) - before.tokens.get(k, 0.0) for k in keys},
            class_seconds={
                k: self.class_seconds.get(k, 0.0) - before.class_seconds.get(k, 0.0) for k in keys
            },
            redis_by_command={
                name: delta for name in commands if (delta := command_delta(name))[0] > 0
            },
        )


def parse_server_metrics(text: str, into: ServerCounters) -> ServerCounters:
    """Fill the /metrics part of ``into`` from one scrape's text."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            key = (labels.get("class", ""), labels.get("kind", ""))
            if name == "mixgate_event_loop_lag_seconds_sum":
                into.loop_lag_sum_s = value
            elif name == "mixgate_event_loop_lag_seconds_count":
                into.loop_lag_count = int(value)
            elif name == "mixgate_engine_observed_steps_total":
                into.engine_steps = int(value)
            elif name == "mixgate_engine_observed_step_seconds_total":
                into.engine_step_s = value
            elif name == "mixgate_engine_steps_unseen_total":
                into.engine_steps_unseen = int(value)
            elif name == "mixgate_engine_step_tokens_total":
                into.tokens[key] = value
            elif name == "mixgate_engine_step_class_seconds_total":
                into.class_seconds[key] = value
    return into


def redis_commandstats(url: str) -> dict[str, tuple[int, float]]:
    """Redis ``INFO commandstats``: command -> (calls, µs spent executing it, server-side)."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return {
        name.removeprefix("cmdstat_"): (int(entry["calls"]), float(entry["usec"]))
        for name, entry in stats.items()
        if isinstance(entry, dict)
    }
