"""Where a chat's time goes: the pure part of `mixgate bench breakdown` (no I/O).

From what one run measured (per-chat client and server timings, Redis `INFO commandstats`
deltas, the event-loop lag probe and the engine step composition scraped from /metrics) it
splits the mean chat TTFT and the mean chat ITL into parts that add up to the measured totals:

TTFT (client: request sent -> first content chunk), per chat, then averaged:
- ``queueing``: the server's ``queue_s`` (admission -> first engine step: queue, claim, hand-off);
  where the server reports its parts, each slow chat and ``queueing_split_s`` split it into
  ``dispatch`` (admission -> handed to the engine: the Redis queue, the claim, the gateway's
  loop), ``accept`` (handed -> taken in by the engine core: the transport and the step in
  flight) and ``engine_queue`` (the rest: waiting in the engine's scheduler);
  each slow chat's gateway part also names the two pieces its handler timed: ``intake``
  (handler start -> admitted) and ``delivery`` (first text sampled -> its chunk written);
- ``engine``: the server's ``ttft_s - queue_s`` (first step -> first token sampled);
- ``first_text``: the server's ``text_ttft_s - ttft_s`` (first token sampled -> first token with
  text: the steps a chat waits while its tokens decode to no text yet, which the client does
  not count as a first token; 0 when the server did not report it);
- what is left (client TTFT - server TTFT: HTTP in, admission, token delivery, SSE out) is
  split into ``redis`` (Redis server time per request: the run's non-stream commands' µs over
  the requests sent, plus one delta's share of the stream commands' µs), ``event_loop_lag``
  (the probe's mean lag x ``LOOP_HOPS_PER_DELTA`` wake-ups a delta needs to reach the socket)
  and ``other_gateway`` (the rest: parsing, JSON, network, the client itself).

ITL (client: gap between content chunks), pooled over every gap of every chat:
- ``engine_step``: the mean engine step (every running sequence gets one token per step);
- ``redis``: the stream commands' µs (XADD, XREAD, ...) per delivered chat delta: 0 when
  tokens reach their stream in-process;
- ``event_loop_lag``: ``LOOP_HOPS_PER_DELTA`` x the probe's mean lag;
- ``other_gateway``: the rest.

The Redis parts count Redis's own execution time (``INFO commandstats`` µs), not the round
trip; they and the loop-lag part are estimates from run-wide means, not per-request traces.
Where the named parts exceed a measured total they are scaled down to it (``other_gateway``
0), so the parts always sum to the total. Shares are part / total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bench.report.summary import percentile

__all__ = [
    "LOOP_HOPS_PER_DELTA",
    "STREAM_COMMANDS",
    "ChatTimes",
    "RunCounters",
    "breakdown",
    "split_total",
]

# Redis commands that carry token deltas (the rest is admission, claims, leases, results).
STREAM_COMMANDS: Final = frozenset({"xadd", "xread", "xreadgroup", "xrange", "xrevrange"})
# The slowest chats listed one by one: a p99 over a 30 s run's ~60 chats is its one or two
# slowest, so what those few waited for is what the tail is.
SLOWEST_CHATS: Final = 5
# Event-loop wake-ups between a delta ready in the engine and its bytes on the socket: the
# dispatcher's job task (to XADD it), the handler (XREAD answered -> SSE write).
LOOP_HOPS_PER_DELTA: Final = 2


@dataclass(frozen=True, slots=True)
class ChatTimes:
    """One OK chat as the client and the server saw it (seconds)."""

    ttft_s: float  # client: sent -> first content chunk
    itls_s: tuple[float, ...]  # client: gaps between content chunks
    server_ttft_s: float | None  # server: admission -> first token sampled
    server_queue_s: float | None  # server: admission -> first engine step
    server_text_ttft_s: float | None = None  # server: admission -> first token with text
    predicted_ttft_s: float | None = None  # admission's prediction (x-mixgate-predicted-ttft-ms)
    request_id: str = ""
    sent_s: float | None = None  # client: when it was sent, from the run's start
    server_dispatch_s: float | None = None  # server: admission -> handed to the engine
    server_accept_s: float | None = None  # server: handed -> taken in by the engine core
    server_intake_s: float | None = None  # server: handler start -> admitted
    server_delivery_s: float | None = None  # server: first text sampled -> chunk written
    # server: handed to the engine, first token sampled: instants on the engine's clock
    server_handed_at_s: float | None = None
    server_first_token_at_s: float | None = None


@dataclass(frozen=True, slots=True)
class RunCounters:
    """Server-side counter deltas over the measured run."""

    duration_s: float
    requests: int  # requests the run sent (every class)
    redis_by_command: Mapping[str, tuple[int, float]]  # command -> (calls, µs)
    loop_lag_sum_s: float
    loop_lag_count: int
    engine_steps: int
    engine_step_s: float
    # (class, kind) -> (tokens, seconds shared out by token share)
    engine_by_class_kind: Mapping[tuple[str, str], tuple[float, float]] = field(
        default_factory=dict
    )


def split_total(total: float, named: Mapping[str, float]) -> dict[str, float]:
    """``named`` parts plus ``other_gateway`` so that they sum to ``total``; named parts that
    exceed it are scaled down to it (and other_gateway is 0). Negative parts count as 0."""
    parts = {k: max(0.0, v) for k, v in named.items()}
    named_sum = sum(parts.values())
    total = max(0.0, total)
    if named_sum > total:
        scale = total / named_sum if named_sum else 0.0
        parts = {k: v * scale for k, v in parts.items()}
        parts["other_gateway"] = 0.0
    else:
        parts["other_gateway"] = total - named_sum
    return parts


def queueing_split(chat: ChatTimes) -> dict[str, float | None]:
    """The chat's queue_s in its three parts (None where the server did not report them);
    each part clamped into what is left of queue_s, so that they sum to it."""
    if chat.server_queue_s is None or chat.server_dispatch_s is None:
        return {"dispatch": None, "accept": None, "engine_queue": None}
    queue_s = max(0.0, chat.server_queue_s)
    dispatch_s = min(queue_s, max(0.0, chat.server_dispatch_s))
    accept_s = None
    if chat.server_accept_s is not None:
        accept_s = min(queue_s - dispatch_s, max(0.0, chat.server_accept_s))
    return {
        "dispatch": dispatch_s,
        "accept": accept_s,
        "engine_queue": queue_s - dispatch_s - (accept_s or 0.0),
    }


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _block(total: float | None, parts: dict[str, float] | None) -> dict[str, Any]:
    if total is None or parts is None:
        return {"total": None, "parts": {}, "shares": {}}
    shares = {k: (v / total if total > 0 else 0.0) for k, v in parts.items()}
    return {"total": total, "parts": parts, "shares": shares}


def _redis(counters: RunCounters) -> dict[str, Any]:
    calls = sum(c for c, _ in counters.redis_by_command.values())
    usec = sum(u for _, u in counters.redis_by_command.values())
    return {
        "calls": calls,
        "usec": usec,
        "usec_per_call": usec / calls if calls else 0.0,
        "calls_per_request": calls / counters.requests if counters.requests else None,
        "busy_fraction": usec / 1e6 / counters.duration_s if counters.duration_s > 0 else None,
        "by_command": {
            name: {"calls": c, "usec": u}
            for name, (c, u) in sorted(counters.redis_by_command.items(), key=lambda kv: -kv[1][1])
        },
    }


def _engine(counters: RunCounters) -> dict[str, Any]:
    steps, seconds = counters.engine_steps, counters.engine_step_s
    return {
        "steps": steps,
        "step_seconds": seconds,
        "mean_step_s": seconds / steps if steps else None,
        "busy_fraction": seconds / counters.duration_s if counters.duration_s > 0 else None,
        "by_class_kind": {
            f"{cls}/{kind}": {
                "tokens": tokens,
                "tokens_per_step": tokens / steps if steps else None,
                "seconds": secs,
                "time_share": secs / seconds if seconds > 0 else None,
            }
            for (cls, kind), (tokens, secs) in sorted(counters.engine_by_class_kind.items())
        },
    }


def predicted_vs_measured(
    pairs: Sequence[tuple[float, float]],
) -> dict[str, Any]:
    """(predicted, measured) TTFT pairs of one class: means, percentiles, how often admission
    predicted less than what happened."""
    predicted = [p for p, _ in pairs]
    measured = [m for _, m in pairs]
    return {
        "count": len(pairs),
        "predicted_mean_s": _mean(predicted),
        "measured_mean_s": _mean(measured),
        "predicted_p50_s": percentile(predicted, 50),
        "measured_p50_s": percentile(measured, 50),
        "predicted_p99_s": percentile(predicted, 99),
        "measured_p99_s": percentile(measured, 99),
        "under_predicted": sum(1 for p, m in pairs if p < m),
    }


def breakdown(
    chats: Sequence[ChatTimes],
    counters: RunCounters,
    bulk_ttft_pairs: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """The JSON of `mixgate bench breakdown` (shape in the module docstring and README)."""
    redis = _redis(counters)
    engine = _engine(counters)
    lag_mean_s = (
        counters.loop_lag_sum_s / counters.loop_lag_count if counters.loop_lag_count else 0.0
    )
    stream_usec = sum(
        usec for name, (_, usec) in counters.redis_by_command.items() if name in STREAM_COMMANDS
    )
    deltas = sum(len(chat.itls_s) + 1 for chat in chats)
    redis_per_delta_s = stream_usec / 1e6 / deltas if deltas else 0.0
    other_usec = redis["usec"] - stream_usec
    redis_per_request_s = other_usec / 1e6 / counters.requests if counters.requests else 0.0
    redis["stream_usec_per_delta"] = redis_per_delta_s * 1e6
    redis["other_usec_per_request"] = redis_per_request_s * 1e6
    timed = [c for c in chats if c.server_ttft_s is not None and c.server_queue_s is not None]

    # (client TTFT, the chat, its server parts, its gateway parts), per chat.
    ttft_splits: list[tuple[float, ChatTimes, dict[str, float], dict[str, float]]] = []
    for chat in timed:
        assert chat.server_ttft_s is not None and chat.server_queue_s is not None
        queueing = max(0.0, chat.server_queue_s)
        engine_s = max(0.0, chat.server_ttft_s - chat.server_queue_s)
        first_text_s = 0.0
        if chat.server_text_ttft_s is not None:
            first_text_s = max(0.0, chat.server_text_ttft_s - chat.server_ttft_s)
        server_s = queueing + engine_s + first_text_s
        # Client TTFT below the server's (a clock edge): the gateway part is 0, not negative.
        total = max(chat.ttft_s, server_s)
        gateway = split_total(
            total - server_s,
            {
                "redis": redis_per_request_s + redis_per_delta_s,
                "event_loop_lag": LOOP_HOPS_PER_DELTA * lag_mean_s,
            },
        )
        server_parts = {"queueing": queueing, "engine": engine_s, "first_text": first_text_s}
        ttft_splits.append((total, chat, server_parts, gateway))
    ttft_total = _mean([split[0] for split in ttft_splits])
    ttft_parts = None
    if ttft_splits:
        every = [{**server, **gateway} for _, _, server, gateway in ttft_splits]
        ttft_parts = {k: sum(p[k] for p in every) / len(every) for k in every[0]}

    splits = [queueing_split(chat) for chat in timed]
    split_means = {
        part: _mean([v for split in splits if (v := split[part]) is not None])
        for part in ("dispatch", "accept", "engine_queue")
    }

    gaps = [gap for chat in chats for gap in chat.itls_s]
    itl_total = _mean(gaps)
    itl_parts = None
    if itl_total is not None:
        itl_parts = split_total(
            itl_total,
            {
                "engine_step": engine["mean_step_s"] or 0.0,
                "redis": redis_per_delta_s,
                "event_loop_lag": LOOP_HOPS_PER_DELTA * lag_mean_s,
            },
        )
        # split_total names the remainder other_gateway: the engine step is not the gateway's,
        # but what the step does not explain is spent outside the engine.

    chat_pairs = [
        (c.predicted_ttft_s, c.server_ttft_s)
        for c in timed
        if c.predicted_ttft_s is not None and c.server_ttft_s is not None
    ]
    return {
        "duration_s": counters.duration_s,
        "chats": len(chats),
        "chats_with_server_timings": len(timed),
        "chats_with_text_timings": sum(1 for c in timed if c.server_text_ttft_s is not None),
        "ttft_s": _block(ttft_total, ttft_parts),
        # The mean of ttft_s's "queueing" part, in its parts (over chats whose server said).
        "queueing_split_s": split_means,
        "itl_s": _block(itl_total, itl_parts),
        "chat_ttft_client_s": {
            "p50": percentile([c.ttft_s for c in chats], 50),
            "p99": percentile([c.ttft_s for c in chats], 99),
        },
        "chat_itl_client_s": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99)},
        "slowest_chats": [
            {
                "request_id": chat.request_id,
                "sent_s": chat.sent_s,
                "ttft_s": total,
                **{f"{name}_s": seconds for name, seconds in server.items()},
                **{f"{name}_s": seconds for name, seconds in queueing_split(chat).items()},
                # Two parts of gateway_s the handler measured itself (None where it did not).
                "intake_s": chat.server_intake_s,
                "delivery_s": chat.server_delivery_s,
                "gateway_s": sum(gateway.values()),
                # Instants on the engine's clock, to lay the chat against the engine's steps.
                "handed_at_s": chat.server_handed_at_s,
                "first_token_at_s": chat.server_first_token_at_s,
            }
            for total, chat, server, gateway in sorted(ttft_splits, key=lambda row: -row[0])[
                :SLOWEST_CHATS
            ]
        ],
        "redis": redis,
        "event_loop": {"lag_mean_s": lag_mean_s, "probes": counters.loop_lag_count},
        "engine": engine,
        # Both from admission on the server's clock: what admission predicted and what the
        # engine did (interactive: first token sampled; bulk: the job's first token).
        "predicted_vs_measured_ttft": {
            "interactive": predicted_vs_measured(chat_pairs),
            "bulk": predicted_vs_measured(list(bulk_ttft_pairs)),
        },
    }
