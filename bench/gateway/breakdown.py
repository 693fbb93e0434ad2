"""`mixgate bench breakdown`: drive a workload (default: chat-over-backlog) against a fresh
`mixgate serve` and say where each chat's TTFT and ITL go: queueing, the engine (step time and
its composition per class), Redis and event-loop lag (bench/gateway/breakdown_shares.py), plus
admission's predicted TTFT against the measured one per class, and for the slowest chats the
engine steps each waited on (bench/gateway/breakdown_steps.py). Prints the shares as a table
and writes JSON (``--json``, default OUT/breakdown.json) and the run folder (OUT/run).

    mixgate bench breakdown --out results/breakdown --threads 2

Redis counts are the server's (``INFO commandstats``): use the throwaway redis-server (no
``--redis-url``) so that nothing else's commands are counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.gateway.breakdown_args import add_breakdown_arguments
from bench.gateway.breakdown_sender import (
    BreakdownSender,
    ServerCounters,
    parse_server_metrics,
    redis_commandstats,
)
from bench.gateway.breakdown_shares import ChatTimes, RunCounters, breakdown
from bench.gateway.breakdown_steps import StepTrace, attach_steps, describe_tokens
from bench.live.compare import ensure_model
from bench.live.processes import ServerProcess, redis_url
from bench.live.run import model_name
from bench.load.generator import LoadResult, run_load
from bench.load.records import OK
from bench.load.workload import dump_workload, load_workload
from bench.report.run_folder import write_run_folder
from bench.report.summary import summarize

__all__ = ["add_breakdown_arguments", "run_breakdown"]


def _counters(client: httpx.Client, redis: str) -> ServerCounters:
    counters = ServerCounters(redis_by_command=redis_commandstats(redis))
    return parse_server_metrics(client.get("/metrics", timeout=10).text, counters)


def _chats(result: LoadResult) -> list[ChatTimes]:
    chats = []
    for record in result.records:
        if record.request_class != "interactive" or record.outcome != OK or record.ttft_s is None:
            continue
        chats.append(
            ChatTimes(
                ttft_s=record.ttft_s,
                itls_s=tuple(record.itls_s),
                server_ttft_s=record.server_ttft_s,
                server_text_ttft_s=record.server_text_ttft_s,
                server_queue_s=record.queue_delay_s,
                server_dispatch_s=record.server_dispatch_s,
                server_accept_s=record.server_accept_s,
                server_intake_s=record.server_intake_s,
                server_delivery_s=record.server_delivery_s,
                server_handed_at_s=record.server_handed_at_s,
                server_first_token_at_s=record.server_first_token_at_s,
                predicted_ttft_s=record.predicted_ttft_s,
                request_id=record.request_id,
                sent_s=record.sent_s,
            )
        )
    return chats


def _bulk_pairs(result: LoadResult) -> list[tuple[float, float]]:
    pairs = []
    for record in result.records:
        if record.request_class != "bulk" or record.outcome != OK:
            continue
        if record.predicted_ttft_s is not None and record.ttft_s is not None:
            pairs.append((record.predicted_ttft_s, record.ttft_s))
    return pairs


async def _drive(url: str, workload: Any, model: str, drain_s: float) -> LoadResult:
    # The chats go from their own process, as in every other benchmark: sent from the loop
    # that builds and posts a backlog's job bodies, a `mixed` run's first chats left 0.1-0.34 s
    # late and read 250-500 ms of TTFT that was the client's own (their records carry what
    # the server said, so nothing needs reading back from the sender).
    return await run_load(url, workload, model=model, drain_s=drain_s, sender_class=BreakdownSender)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Run once and return the breakdown (also writes the run folder under OUT/run)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workload = load_workload(args.workload)
    if args.duration_s is not None:
        workload = replace(workload, duration_s=args.duration_s)
    model_dir = ensure_model(args.model, out, args.preset)
    with redis_url(args.redis_url, out / "redis") as redis:
        server = ServerProcess(
            model_dir,
            redis,
            f"{{mg-breakdown-{uuid.uuid4().hex[:8]}}}:",
            out / "server",
            envelope_path=Path(args.envelope) if args.envelope else None,
            policy=args.policy,
            extra_env={
                "MIXGATE_NUM_THREADS": str(args.threads),
                "MIXGATE_KV_CACHE_BYTES": str(256 << 20),
                "MIXGATE_LEASE_S": "10",
                "MIXGATE_LOG_LEVEL": "warning",
                "MIXGATE_ENGINE": args.engine,
            },
        ).start()
        try:
            with httpx.Client(base_url=server.url) as client:
                before = _counters(client, redis)
                trace = StepTrace(server.url).start()
                try:
                    result = asyncio.run(
                        _drive(server.url, workload, model_name(server.url), args.drain_s)
                    )
                finally:
                    steps = trace.stop()
                delta = _counters(client, redis).minus(before)
        finally:
            server.stop()
    counters = RunCounters(
        duration_s=result.duration_s,
        requests=len(result.records),
        redis_by_command=delta.redis_by_command,
        loop_lag_sum_s=delta.loop_lag_sum_s,
        loop_lag_count=delta.loop_lag_count,
        engine_steps=delta.engine_steps,
        engine_step_s=delta.engine_step_s,
        engine_by_class_kind={
            key: (tokens, delta.class_seconds.get(key, 0.0)) for key, tokens in delta.tokens.items()
        },
    )
    report = breakdown(_chats(result), counters, _bulk_pairs(result))
    report["engine"]["steps_unseen"] = delta.engine_steps_unseen
    report["engine"]["steps_traced"] = len(steps)
    report["engine"]["steps_missed_by_trace"] = trace.missed
    attach_steps(report["slowest_chats"], steps)
    report["workload"] = workload.name
    report["policy"] = args.policy
    report["engine_backend"] = args.engine
    summary = summarize(result.records, result.duration_s)
    report["summary"] = summary
    write_run_folder(
        out / "run",
        workload_toml=dump_workload(workload),
        runtime_config={
            "policy": args.policy,
            "engine": args.engine,
            "threads": args.threads,
            "offered": result.offered,
        },
        records=result.records,
        samples=result.samples,
        summary=summary,
        title=f"{workload.name}: latency breakdown under {args.policy}",
    )
    return report


def _ms(value: Any) -> str:
    return "-" if value is None else f"{1000 * float(value):.1f}"


def _print(report: dict[str, Any]) -> None:
    console = Console()
    for metric, title in (("ttft_s", "chat TTFT (mean)"), ("itl_s", "chat ITL (mean)")):
        block = report[metric]
        table = Table(title=f"{title}: {_ms(block['total'])} ms")
        for column in ("part", "ms", "share"):
            table.add_column(column, justify="right")
        for part, seconds in block["parts"].items():
            table.add_row(part, _ms(seconds), f"{block['shares'][part]:.1%}")
        console.print(table)
    engine = Table(title=f"engine steps: {report['engine']['steps']}, mean "
                   f"{_ms(report['engine']['mean_step_s'])} ms")  # fmt: skip
    for column in ("class/kind", "tokens/step", "time share"):
        engine.add_column(column, justify="right")
    for name, block in report["engine"]["by_class_kind"].items():
        per_step, share = block["tokens_per_step"], block["time_share"]
        engine.add_row(
            name,
            "-" if per_step is None else f"{per_step:.1f}",
            "-" if share is None else f"{share:.1%}",
        )
    console.print(engine)
    predicted = Table(title="admission's predicted vs measured TTFT (server clock, from admission)")
    for column in ("class", "n", "pred mean", "meas mean", "pred p99", "meas p99", "under"):
        predicted.add_column(column, justify="right")
    for cls, block in report["predicted_vs_measured_ttft"].items():
        predicted.add_row(
            cls,
            str(block["count"]),
            _ms(block["predicted_mean_s"]),
            _ms(block["measured_mean_s"]),
            _ms(block["predicted_p99_s"]),
            _ms(block["measured_p99_s"]),
            str(block["under_predicted"]),
        )
    console.print(predicted)
    slowest = Table(title="slowest chats (client TTFT; sent: seconds into the run)")
    columns = {
        "TTFT": "ttft_s",
        "queueing": "queueing_s",
        "  dispatch": "dispatch_s",
        "  accept": "accept_s",
        "  engine queue": "engine_queue_s",
        "engine": "engine_s",
        "first text": "first_text_s",
        "gateway": "gateway_s",
        "  intake": "intake_s",
        "  delivery": "delivery_s",
    }
    for column in ("chat", "sent s", *columns):
        slowest.add_column(column, justify="right")
    for chat in report["slowest_chats"]:
        slowest.add_row(
            chat["request_id"],
            "-" if chat["sent_s"] is None else f"{chat['sent_s']:.2f}",
            *(_ms(chat[key]) for key in columns.values()),
        )
    console.print(slowest)
    _print_steps_behind(console, report["slowest_chats"])
    split = report["queueing_split_s"]
    split = {part: _ms(seconds) for part, seconds in report["queueing_split_s"].items()}
    console.print(
        f"queueing (mean) = dispatch {split['dispatch']} + accept {split['accept']}"
        f" + engine queue {split['engine_queue']} ms"
    )
    redis, loop = report["redis"], report["event_loop"]
    console.print(
        f"redis: {redis['calls']} commands, {redis['usec_per_call']:.1f} µs each server-side; "
        f"event-loop lag mean {_ms(loop['lag_mean_s'])} ms over {loop['probes']} probes"
    )


def _print_steps_behind(console: Console, slowest: list[dict[str, Any]]) -> None:
    table = Table(
        title="engine steps behind the slowest chats (from hand-off to first token; "
        "start: ms after the hand-off)"
    )
    for column in ("chat", "step", "start", "ms", "tokens"):
        table.add_column(column, justify="right" if column != "tokens" else "left")
    for chat in slowest:
        for step in chat.get("steps") or ():
            table.add_row(
                chat["request_id"],
                str(step["step_index"]) + (" (in flight)" if step["in_flight"] else ""),
                _ms(step["offset_s"]),
                _ms(step["duration_s"]),
                describe_tokens(step["tokens"]),
            )
    if table.row_count:
        console.print(table)


def run_breakdown(args: argparse.Namespace) -> int:
    report = measure(args)
    path = Path(args.json) if args.json else Path(args.out) / "breakdown.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    _print(report)
    print(f"wrote {path}")
    return 0
