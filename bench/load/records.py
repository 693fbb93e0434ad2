"""What a load run records: one row per request and one row per metrics sample.

The load generator writes them, the summary, report, plots and envelope derivation read them;
they travel as JSONL in a run's results folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Outcomes of a request, as the client saw it.
OK, REJECTED, EXPIRED, CANCELLED, ERROR = "ok", "rejected", "expired", "cancelled", "error"
# Still queued or running when the run ended (bulk backlogs outlive a run on purpose).
INCOMPLETE = "incomplete"
OUTCOMES = (OK, REJECTED, EXPIRED, CANCELLED, ERROR, INCOMPLETE)


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    # "interactive" | "bulk"
    request_class: str
    prompt_tokens: int
    max_tokens: int
    # Seconds from the start of the run: when the workload scheduled it, and when it was sent.
    scheduled_s: float
    sent_s: float
    outcome: str = ERROR
    status_code: int | None = None
    # The OpenAI error code of a rejection or failure (queue_full, deadline_unmeetable, ...).
    error_code: str | None = None
    retry_after_s: float | None = None
    # Server-side: admission to the first engine step (None when the server did not say).
    queue_delay_s: float | None = None
    # Its first two parts, where the server said: admission -> handed to the engine, and
    # handed -> taken in by the engine core (the rest waited in the engine's scheduler).
    server_dispatch_s: float | None = None
    server_accept_s: float | None = None
    # Client-side for interactive (request sent -> first content); server-side for bulk jobs.
    ttft_s: float | None = None
    # Gaps between content chunks (interactive only).
    itls_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    # A cancellation the workload planned: "before_first_token" | "mid_stream" | None.
    cancel_plan: str | None = None
    # What mixgate said about the request, where the sender reads it (`bench breakdown`):
    # admission's predicted TTFT (x-mixgate-predicted-ttft-ms), and for a chat the server's
    # own TTFT from admission to the first token and to the first text (mixgate_timings).
    predicted_ttft_s: float | None = None
    server_ttft_s: float | None = None
    server_text_ttft_s: float | None = None
    # A streamed chat's handler times (mixgate_timings): start -> admitted, and first text
    # sampled -> its chunk handed to the response.
    server_intake_s: float | None = None
    server_delivery_s: float | None = None
    # A streamed chat's two instants on the engine's clock (mixgate_timings; the clock of
    # GET /v1/engine/steps): handed to the engine, and its first token sampled.
    server_handed_at_s: float | None = None
    server_first_token_at_s: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)


@dataclass(slots=True)
class MetricSample:
    """One scrape of the server's /metrics, at `t_s` seconds from the start of the run."""

    t_s: float
    queue_depth: dict[str, float] = field(default_factory=dict)
    queued_tokens: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    kv_usage: float = 0.0
    preemptions: float = 0.0
    steps: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MetricSample:
        return cls(**data)


def write_jsonl(path: Path, rows: list[RequestRecord] | list[MetricSample]) -> None:
    path.write_text("".join(row.to_json() + "\n" for row in rows))


def read_records(path: Path) -> list[RequestRecord]:
    lines = path.read_text().splitlines()
    return [RequestRecord.from_dict(json.loads(line)) for line in lines if line]


def read_samples(path: Path) -> list[MetricSample]:
    lines = path.read_text().splitlines()
    return [MetricSample.from_dict(json.loads(line)) for line in lines if line]
