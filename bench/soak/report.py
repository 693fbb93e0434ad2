"""What a soak run samples from the server over time, and the verdict drawn from it.

A sample is the server's resident memory (VmRSS from /proc, no psutil) and a few /metrics
series: KV cache usage, live asyncio tasks, engine running/waiting sequences, queue depth and
the dispatcher's lease losses. The verdict: memory flat over the second half of the load,
every KV block free at the end, the engine idle, the task count back to what it was before the
load, no lease lost and no request the server failed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["SoakSample", "Verdict", "format_table", "judge", "sample_from_metrics"]

_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class SoakSample:
    # Seconds since the load started (negative: the idle baseline before it).
    t_s: float
    rss_bytes: int | None
    kv_usage: float
    asyncio_tasks: int
    running: int
    waiting: int
    queued: int
    # The dispatcher's lease_lost events since the server started (mixgate_dispatch_events).
    lease_lost: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_from_metrics(text: str, t_s: float, rss_bytes: int | None) -> SoakSample:
    values: dict[str, float] = {}
    lease_lost = 0.0
    for family in text_string_to_metric_families(text):
        for series in family.samples:
            values[series.name] = values.get(series.name, 0.0) + float(series.value)
            lost = series.labels.get("event") == "lease_lost"
            if series.name == "mixgate_dispatch_events_total" and lost:
                lease_lost += float(series.value)
    return SoakSample(
        t_s=t_s,
        rss_bytes=rss_bytes,
        kv_usage=values.get("mixgate_kv_cache_usage", 0.0),
        asyncio_tasks=int(values.get("mixgate_asyncio_tasks", 0)),
        running=int(values.get("mixgate_engine_running", 0)),
        waiting=int(values.get("mixgate_engine_waiting", 0)),
        queued=int(values.get("mixgate_queue_depth", 0)),
        lease_lost=int(lease_lost),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    # RSS at the end of the load minus RSS at its midpoint (None: RSS not sampled).
    rss_growth_second_half_bytes: int | None
    rss_flat: bool
    kv_blocks_free: bool
    engine_idle: bool
    idle_tasks: int
    final_tasks: int
    no_task_leak: bool
    # Leases this replica lost during the run (its own renew or complete found it stale).
    lease_losses: int = 0
    # Requests the server failed: a 5xx, or a stream that broke.
    server_errors: int = 0

    @property
    def ok(self) -> bool:
        healthy = self.lease_losses == 0 and self.server_errors == 0
        return (
            healthy
            and self.rss_flat
            and self.kv_blocks_free
            and self.engine_idle
            and self.no_task_leak
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _rss_growth(load: list[SoakSample]) -> int | None:
    with_rss = [s for s in load if s.rss_bytes is not None]
    if len(with_rss) < 2:
        return None
    mid_t_s = with_rss[-1].t_s / 2
    mid = min(with_rss, key=lambda s: abs(s.t_s - mid_t_s))
    assert mid.rss_bytes is not None and with_rss[-1].rss_bytes is not None
    return with_rss[-1].rss_bytes - mid.rss_bytes


def judge(
    idle: SoakSample,
    load: list[SoakSample],
    final: SoakSample,
    max_rss_growth_bytes: int,
    server_errors: int = 0,
) -> Verdict:
    """`idle` before the load, `load` during it, `final` once it has settled."""
    growth = _rss_growth(load)
    return Verdict(
        rss_growth_second_half_bytes=growth,
        # NOTE: None (no RSS: a remote server) is not a failure, the table says "n/a".
        rss_flat=growth is None or growth <= max_rss_growth_bytes,
        kv_blocks_free=final.kv_usage == 0.0,
        engine_idle=final.running == 0 and final.waiting == 0,
        idle_tasks=idle.asyncio_tasks,
        final_tasks=final.asyncio_tasks,
        no_task_leak=final.asyncio_tasks <= idle.asyncio_tasks,
        lease_losses=final.lease_lost - idle.lease_lost,
        server_errors=server_errors,
    )


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / _MIB:.1f}"


def format_table(samples: list[SoakSample], verdict: Verdict) -> str:
    rows = [
        f"{'t_s':>8} {'rss_MiB':>9} {'kv_use':>7} {'tasks':>6} {'run':>4} {'wait':>5} {'queue':>6}"
    ]
    for s in samples:
        rows.append(
            f"{s.t_s:8.1f} {_mib(s.rss_bytes):>9} {s.kv_usage:7.3f} {s.asyncio_tasks:6d} "
            f"{s.running:4d} {s.waiting:5d} {s.queued:6d}"
        )
    growth = verdict.rss_growth_second_half_bytes
    rows += [
        "",
        f"RSS growth over the second half: {_mib(growth)} MiB "
        f"({'flat' if verdict.rss_flat else 'GROWING'})",
        f"KV blocks all free at the end: {verdict.kv_blocks_free}",
        f"engine idle at the end: {verdict.engine_idle}",
        f"asyncio tasks: idle {verdict.idle_tasks}, at the end {verdict.final_tasks} "
        f"({'no leak' if verdict.no_task_leak else 'LEAK'})",
        f"leases lost: {verdict.lease_losses}",
        f"requests the server failed (5xx or broken stream): {verdict.server_errors}",
        f"verdict: {'PASS' if verdict.ok else 'FAIL'}",
    ]
    return "\n".join(rows)
