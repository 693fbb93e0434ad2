"""`mixgate bench gateway`: what the gateway adds on top of the engine, on the `tiny` preset so
the model itself costs little.

1. Queue round trips against a real Redis (`bench.gateway_bench_queue`): admissions/s, full
   round trips/s (admit, claim, publish DELTA + END, complete, read back), p50/p99 of admit and
   of claim.
2. TTFT through `mixgate serve` vs an in-process AsyncEngine on the same model folder and the
   same prompts (`bench.gateway_bench_ttft`); gateway-added = gateway minus direct, per
   percentile. The two run one after the other, not side by side, so their noise differs.

Targets (reported, not enforced): gateway-added TTFT p99 <= 2 ms; >= 2,000 admissions/s on 2
cores. Without `--redis-url` a throwaway redis-server is started and stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.gateway_bench_queue import run_queue_bench
from bench.gateway_bench_ttft import MAX_TOKENS, engine_ttft_ms, gateway_ttft_ms
from bench.processes import redis_url
from bench.summary import percentile
from engine.make_model import make_model

__all__ = ["percentiles", "run_gateway_bench"]

TARGET_ADDED_P99_MS = 2.0
TARGET_ADMISSIONS_PER_S = 2000.0
PRESET = "tiny"


def percentiles(values: list[float]) -> dict[str, float]:
    """Nearest-rank p50 and p99 (bench.summary's method)."""
    p50, p99 = percentile(values, 50), percentile(values, 99)
    if p50 is None or p99 is None:
        raise ValueError("no samples")
    return {"p50": p50, "p99": p99}


def _measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    with redis_url(args.redis_url, work) as url:
        queue = asyncio.run(run_queue_bench(url, args.admissions, args.concurrency))
        model_dir = make_model(work / "model", PRESET, seed=0)
        gateway = gateway_ttft_ms(model_dir, url, work / "server", args.chats)
    direct = asyncio.run(engine_ttft_ms(model_dir, args.chats))
    ttft_gateway, ttft_engine = percentiles(gateway), percentiles(direct)
    return {
        "admissions_per_s": queue.admissions_per_s,
        "round_trips_per_s": queue.round_trips_per_s,
        "admit_ms": percentiles(queue.admit_ms),
        "claim_ms": percentiles(queue.claim_ms),
        "ttft_gateway_ms": ttft_gateway,
        "ttft_engine_ms": ttft_engine,
        "gateway_added_ms": {q: ttft_gateway[q] - ttft_engine[q] for q in ("p50", "p99")},
        "config": {
            "redis_url": args.redis_url or "spawned redis-server",
            "admissions": args.admissions,
            "concurrency": args.concurrency,
            "chats": args.chats,
            "chats_timed_gateway": len(gateway),
            "chats_timed_engine": len(direct),
            "preset": PRESET,
            "max_tokens": MAX_TOKENS,
            "num_threads": 1,
            "cpu_count": os.cpu_count(),
            "note": "gateway and direct-engine TTFT run one after the other, not side by "
            "side, so their noise differs; gateway_added = gateway minus direct per percentile",
        },
    }


def _print(result: dict[str, Any]) -> None:
    table = Table(title=f"mixgate bench gateway ({PRESET} preset)")
    for column in ("metric", "value / p50", "p99", "target"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    admits = result["admissions_per_s"]
    admits_met = "met" if admits >= TARGET_ADMISSIONS_PER_S else "missed"
    table.add_row(
        "admissions/s",
        f"{admits:,.0f}",
        "",
        f">= {TARGET_ADMISSIONS_PER_S:,.0f} ({admits_met})",
    )
    table.add_row("full round trips/s", f"{result['round_trips_per_s']:,.0f}", "", "")
    added_p99 = result["gateway_added_ms"]["p99"]
    met = "met" if added_p99 <= TARGET_ADDED_P99_MS else "missed"
    rows = [
        ("admit ms", "admit_ms", ""),
        ("claim ms", "claim_ms", ""),
        ("TTFT gateway ms", "ttft_gateway_ms", ""),
        ("TTFT engine direct ms", "ttft_engine_ms", ""),
        ("gateway-added TTFT ms", "gateway_added_ms", f"p99 <= {TARGET_ADDED_P99_MS} ({met})"),
    ]
    for label, key, target in rows:
        table.add_row(label, f"{result[key]['p50']:.3f}", f"{result[key]['p99']:.3f}", target)
    console = Console()
    console.print(table)
    console.print(f"[dim]{result['config']['cpu_count']} CPUs; {result['config']['note']}.[/dim]")


def run_gateway_bench(args: argparse.Namespace) -> int:
    for name in ("admissions", "concurrency", "chats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be at least 1")
    with tempfile.TemporaryDirectory(prefix="mixgate-bench-gw-") as tmp:
        result = _measure(args, Path(tmp))
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0
